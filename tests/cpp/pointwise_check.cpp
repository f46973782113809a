// The non-GEMM float loops on every ISA this CPU has and this build compiles ("baseline", "avx2"
// on x86-64; "baseline", "neon" on aarch64), against libm in double and against the portable
// scalar code:
//   * activations (core/activation.h, arch/arm/activation_neon.h): every kind over a grid of
//     [-30, 30], large values, +-inf, NaN, +-0, at lengths that leave every tail;
//   * softmax exp and sum (core/attention.h exp_row, arch/arm/attention_neon.h), -inf included;
//   * layer and RMS norms (core/norm.h, arch/arm/norm_neon.h), with and without weight and bias,
//     a row whose mean is large against its spread.
// tests/test_pointwise_isa.py builds it natively and for aarch64 (run under qemu-aarch64). Prints
// one line per ISA checked; exits 1 at the first mismatch, naming it.
#define ETFUSE_CORE_KERNELS 1
#include "isa_loop.h"
#include "core/activation.h"
#include "core/attention.h"
#include "core/norm.h"

#include <cmath>
#include <cstdio>
#include <vector>

using namespace etfuse::core;
using activation::Kind;

namespace {

uint32_t rng = 12345;
float next_value() {  // uniform in [-1, 1]
  rng = rng * 1664525u + 1013904223u;
  return static_cast<float>((rng >> 8) % 2000001) / 1000000.0f - 1.0f;
}

struct KindInfo {
  Kind kind;
  const char* name;
  double rtol, atol;  // against libm, |x| <= 30
};

double reference(Kind k, double x) {
  const double g = std::fmin(std::fmax(x + 3.0, 0.0), 6.0);
  switch (k) {
    case Kind::kSilu: return x / (1.0 + std::exp(-x));
    case Kind::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Kind::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Kind::kGeluTanh: return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Kind::kHardswish: return x * g / 6.0;
    case Kind::kHardsigmoid: return g / 6.0;
    default: return x;
  }
}

bool same_class(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::isfinite(got);
}

bool check_activations(const char* isa) {
  // erf is A&S 7.1.26 (absolute error 1.5e-7, times |x| / 2 in GELU); exp about 2 ulp
  const KindInfo kinds[] = {{Kind::kSilu, "silu", 2e-6, 1e-7},          {Kind::kSigmoid, "sigmoid", 2e-6, 1e-7},
                            {Kind::kGelu, "gelu", 2e-6, 3e-6},          {Kind::kGeluTanh, "gelu_tanh", 2e-6, 2e-6},
                            {Kind::kHardswish, "hardswish", 1e-6, 1e-7}, {Kind::kHardsigmoid, "hardsigmoid", 1e-6, 1e-7}};
  std::vector<float> xs;
  for (int i = -3000; i <= 3000; ++i) xs.push_back(i * 0.01f + 0.003f);
  for (int i = 0; i < 2000; ++i) xs.push_back(next_value() * 10.0f);
  const float special[] = {0.0f, -0.0f, __builtin_inff(), -__builtin_inff(), __builtin_nanf(""), -__builtin_nanf(""),
                           87.3f, -87.3f, 88.7f, -88.7f, 100.0f, -100.0f, 1e30f, -1e30f, 3.4e38f, -3.4e38f,
                           1e-30f, -1e-30f, 1e-40f, -3.0f, 3.0f, 6.0f, -6.0f};
  for (float s : special) xs.push_back(s);
  for (const KindInfo& k : kinds) {
    // every length up to 19 (each tail of the 8- and 4-float steps), then all at once
    for (size_t len = 1; len <= 20; ++len) {
      const size_t n = len == 20 ? xs.size() : len;
      for (size_t start = 0; start + n <= xs.size(); start += (len == 20 ? n : 997)) {
        std::vector<float> buf(xs.begin() + start, xs.begin() + start + n);
        activation::detail::dispatch(k.kind, buf.data(), static_cast<int64_t>(n));
        for (size_t i = 0; i < n; ++i) {
          const float x = xs[start + i];
          const double got = buf[i];
          const double portable = activation::detail::apply_one(k.kind, x);
          bool ok = same_class(got, portable);
          // against the portable code: the same polynomials, to rounding (its cancellations included)
          if (ok && std::isfinite(portable))
            ok = std::fabs(got - portable) <= 1e-5 * std::fabs(portable) + 1e-6 * std::fmin(std::fabs(x), 1.0) + 1e-37;
          if (ok && std::fabs(x) <= 30.0f) {
            const double want = reference(k.kind, x);
            ok = std::fabs(got - want) <= k.rtol * std::fabs(want) + k.atol * std::fmax(std::fabs(x), 1.0) * 0.5;
          }
          if (!ok) {
            std::printf("MISMATCH isa=%s %s length %zu x=%.9g: got %.9g, portable %.9g, libm %.9g\n", isa, k.name, n,
                        x, got, portable, reference(k.kind, x));
            return false;
          }
        }
      }
    }
  }
  return true;
}

bool check_exp_row(const char* isa) {
  for (int64_t n = 1; n <= 70; ++n) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> s(n);
      for (auto& v : s) v = next_value() * (variant == 2 ? 60.0f : 8.0f);
      if (variant >= 1)
        for (int64_t j = 0; j < n; j += 3) s[j] = -__builtin_inff();  // masked keys
      bool all_inf;
      float m = attention::row_max(s.data(), n, all_inf);
      if (all_inf) m = 0.0f;
      const std::vector<float> in = s;
      const float sum = attention::exp_row(s.data(), n, m);
      double want_sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const double want = in[j] == -__builtin_inff() ? 0.0 : std::exp(double(in[j]) - m);
        want_sum += want;
        // s[j] - m is rounded to float first: its error, up to |x| / 2^24, is exp's relative error
        const double x = double(in[j]) - m;
        const double tol = want == 0.0 ? 0.0 : (1e-6 + 1.2e-7 * std::fabs(x)) * want + (x < -87.0 ? 2e-38 : 0.0);
        if (!(std::fabs(s[j] - want) <= tol)) {
          std::printf("MISMATCH isa=%s exp_row n=%lld variant %d at %lld: x=%.9g got %.9g want %.9g\n", isa,
                      (long long)n, variant, (long long)j, x, s[j], want);
          return false;
        }
      }
      if (!(std::fabs(sum - want_sum) <= 2e-6 * want_sum)) {
        std::printf("MISMATCH isa=%s exp_row n=%lld variant %d: sum %.9g want %.9g\n", isa, (long long)n, variant, sum,
                    want_sum);
        return false;
      }
    }
  }
  return true;
}

bool check_norms(const char* isa) {
  const int64_t lengths[] = {1, 3, 4, 5, 15, 16, 17, 31, 64, 100, 257};
  const attention::Serial serial;
  for (int64_t n : lengths) {
    for (int variant = 0; variant < 8; ++variant) {
      const bool layer = variant & 1, has_w = variant & 2, has_b = variant & 4;
      if (!layer && has_b) continue;
      const int64_t rows = 3;
      std::vector<float> x(rows * n), w(n), b(n), out(rows * n, 12345.0f);
      for (auto& v : x) v = next_value() * 3.0f;
      for (int64_t j = 0; j < n; ++j) x[2 * n + j] = 1000.0f + next_value();  // large mean, small spread
      for (auto& v : w) v = next_value();
      for (auto& v : b) v = next_value();
      norm::Args a;
      a.rows = rows, a.n = n, a.x = x.data(), a.weight = has_w ? w.data() : nullptr;
      a.bias = has_b ? b.data() : nullptr, a.eps = 1e-5f, a.out = out.data();
      if (layer) norm::run_layer(a, serial);
      else norm::run(a, serial);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.data() + r * n;
        double mean = 0.0, sq = 0.0;
        if (layer) {
          for (int64_t j = 0; j < n; ++j) mean += xr[j];
          mean /= n;
        }
        for (int64_t j = 0; j < n; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
        const double inv = 1.0 / std::sqrt(sq / n + 1e-5);
        for (int64_t j = 0; j < n; ++j) {
          double want = (xr[j] - mean) * inv;
          if (has_w) want *= w[j];
          if (has_b) want += b[j];
          // float32 sums of n values, and x - mean where the mean is large against the spread
          const double tol = 1e-5 * (1.0 + std::fabs(mean) * inv * 0.1) * (std::fabs(want) + 1.0);
          const double got = out[r * n + j];
          if (!(std::fabs(got - want) <= tol)) {
            std::printf("MISMATCH isa=%s %s n=%lld weight=%d bias=%d row %lld col %lld: got %.9g want %.9g\n", isa,
                        layer ? "layer_norm" : "rms_norm", (long long)n, int(has_w), int(has_b), (long long)r,
                        (long long)j, got, want);
            return false;
          }
        }
      }
    }
  }
  return true;
}

}  // namespace

int main() {
  return check_isa_loop::for_each_isa({"baseline", "avx2", "neon"}, [&](const char* isa) {
    if (!check_activations(isa) || !check_exp_row(isa) || !check_norms(isa)) return false;
    std::printf("isa %s: activations, softmax exp, norms match\n", isa);
    return true;
  });
}
