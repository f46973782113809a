// The non-GEMM float loops on every ISA this CPU has and this build compiles ("baseline", "avx2"
// on x86-64; "baseline", "neon" on aarch64), against libm in double and against the portable
// scalar code:
//   * activations (core/activation.h, arch/arm/activation_neon.h): every kind over a grid of
//     [-30, 30], large values, +-inf, NaN, +-0, at lengths that leave every tail;
//   * softmax exp and sum (core/attention.h exp_row, arch/arm/attention_neon.h), -inf included;
//   * layer and RMS norms (core/norm.h, arch/arm/norm_neon.h), with and without weight and bias,
//     a row whose mean is large against its spread;
//   * max_pool2d (core/pool2d.h, arch/arm/pool2d_neon.h, AVX-512's planes where the CPU has them):
//     windows, strides, padding, dilation and ceil_mode, NaN and -inf inputs, against a window
//     loop here, bit for bit.
// tests/test_pointwise_isa.py builds it natively and for aarch64 (run under qemu-aarch64). Prints
// one line per ISA checked; exits 1 at the first mismatch, naming it.
#include "isa_loop.h"
#include "core/activation.h"
#include "core/attention.h"
#include "core/norm.h"
#include "core/pool2d.h"

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

// torch's max_pool2d, one window at a time: a NaN in the window wins, the padding never does.
float window_max(const std::vector<float>& plane, int64_t h, int64_t w, const pool2d::Params& p, int64_t oy, int64_t ox) {
  float m = -INFINITY;
  bool nan = false;
  for (int64_t ky = 0; ky < p.kernel[0]; ++ky) {
    for (int64_t kx = 0; kx < p.kernel[1]; ++kx) {
      const int64_t y = oy * p.stride[0] - p.padding[0] + ky * p.dilation[0];
      const int64_t x = ox * p.stride[1] - p.padding[1] + kx * p.dilation[1];
      if (y < 0 || y >= h || x < 0 || x >= w) continue;
      const float v = plane[y * w + x];
      nan = nan || std::isnan(v);
      m = v > m ? v : m;
    }
  }
  return nan ? NAN : m;
}

bool check_max_pool(const char* isa) {
  struct Case {
    int64_t h, w, k0, k1, s0, s1, p0, p1, d0, d1;
    bool ceil;
  };
  const Case cases[] = {{47, 47, 3, 3, 2, 2, 0, 0, 1, 1, true},  {32, 32, 2, 2, 2, 2, 0, 0, 1, 1, false},
                        {13, 21, 3, 3, 1, 1, 1, 1, 1, 1, false}, {9, 7, 3, 2, 2, 1, 1, 1, 1, 1, true},
                        {12, 30, 5, 3, 1, 2, 2, 1, 2, 1, false}, {6, 5, 2, 3, 3, 3, 1, 1, 1, 2, true},
                        {1, 3, 1, 3, 1, 1, 0, 1, 1, 1, false},   {17, 19, 3, 3, 2, 2, 1, 1, 1, 1, true}};
  const int64_t planes = 3;
  for (const Case& c : cases) {
    pool2d::Params p;
    p.kernel[0] = c.k0, p.kernel[1] = c.k1, p.stride[0] = c.s0, p.stride[1] = c.s1;
    p.padding[0] = c.p0, p.padding[1] = c.p1, p.dilation[0] = c.d0, p.dilation[1] = c.d1, p.ceil_mode = c.ceil;
    const int64_t oh = pool2d::out_extent(c.h, c.k0, c.s0, c.p0, c.d0, c.ceil);
    const int64_t ow = pool2d::out_extent(c.w, c.k1, c.s1, c.p1, c.d1, c.ceil);
    std::vector<float> in(static_cast<size_t>(planes * c.h * c.w));
    for (size_t i = 0; i < in.size(); ++i) in[i] = i % 37 == 5 ? NAN : i % 41 == 7 ? -INFINITY : next_value();
    std::vector<float> out(static_cast<size_t>(planes * oh * ow), 12345.0f);
    pool2d::run<true>(in.data(), out.data(), planes, c.h, c.w, oh, ow, p,
                      [](int64_t b, int64_t e, int64_t, const auto& fn) { fn(b, e); });
    for (int64_t q = 0; q < planes; ++q) {
      const std::vector<float> plane(in.begin() + q * c.h * c.w, in.begin() + (q + 1) * c.h * c.w);
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          const float want = window_max(plane, c.h, c.w, p, oy, ox), got = out[(q * oh + oy) * ow + ox];
          if (std::isnan(want) ? !std::isnan(got) : got != want) {
            std::printf("MISMATCH isa=%s max_pool2d %ldx%ld k=%ldx%ld s=%ldx%ld p=%ldx%ld d=%ldx%ld ceil=%d at plane %ld "
                        "(%ld, %ld): got %g want %g\n", isa, (long)c.h, (long)c.w, (long)c.k0, (long)c.k1, (long)c.s0,
                        (long)c.s1, (long)c.p0, (long)c.p1, (long)c.d0, (long)c.d1, (int)c.ceil, (long)q, (long)oy,
                        (long)ox, got, want);
            return false;
          }
        }
      }
    }
  }
  return true;
}

int main() {
  return check_isa_loop::for_each_isa({"baseline", "avx2", "neon"}, [&](const char* isa) {
    if (!check_activations(isa) || !check_exp_row(isa) || !check_norms(isa) || !check_max_pool(isa)) return false;
    std::printf("isa %s: activations, softmax exp, norms, max pool match\n", isa);
    return true;
  });
}
