// gemm::run against a plain triple loop, on every ISA this CPU has and this build compiles
// ("baseline", "avx2", "avx512" on x86-64; "baseline", "neon" on aarch64): edge tiles (M, N, K
// not multiples of the tile), K in several slices, A by rows, by columns (the transposed
// problems' adjacent rows) and strided, B by rows, transposed, prepacked and read in place, C transposed,
// and the epilogue (per-row or per-column scale or none, per-column bias, residual, clamp); rows up
// to 100 (two row blocks) and 70 columns (NEON packs A's tiles from 4 panels on). tests/test_gemm_isa.py
// builds it natively and for aarch64 (run under qemu-aarch64). Prints one line per ISA checked;
// exits 1 at the first mismatch, naming the case.
#include "check_random.h"
#include "isa_loop.h"
#include "core/gemm.h"

#include <cmath>
#include <cstdio>
#include <vector>

using etfuse::core::gemm::Args;

namespace {

using check_random::next_value;

struct Case {
  int64_t M, N, K;
  int a_layout;  // 0 rows (a_cs 1), 1 columns (a_rs 1), 2 rows with a stride of 2 along k
  int b_layout;  // 0 rows, 1 transposed ([N, K]), 2 prepacked panels, 3 rows N + 3 apart read in place
  bool c_transposed, epilogue, clamp;
  bool column_scale = false;  // the scale per column (conv2d's transposed problems: per output channel)
  bool no_scale = false;  // the epilogue without the scale (a linear's bias and residual)
};

// A case's inputs, its Args but for C, and the reference (want, tol per element of C), made once
// and compared with gemm::run on each ISA.
struct Problem {
  std::vector<float> a, b, bias, scale, residual, packed;
  Args g;
  std::vector<double> want, tol;
};

Problem prepare(const Case& c) {
  const int64_t M = c.M, N = c.N, K = c.K;
  Problem p;
  p.a.resize(static_cast<size_t>(M * K * 2 + 1)), p.b.resize(static_cast<size_t>(K * (N + 3)));
  p.bias.resize(N), p.scale.resize(M > N ? M : N), p.residual.resize(M * N);
  for (auto* v : {&p.a, &p.b, &p.bias, &p.scale, &p.residual})
    for (auto& x : *v) x = next_value();
  Args& g = p.g;
  g.M = M, g.N = N, g.K = K;
  g.A = p.a.data();
  if (c.a_layout == 0) g.a_rs = K, g.a_cs = 1;
  if (c.a_layout == 1) g.a_rs = 1, g.a_cs = M;
  if (c.a_layout == 2) g.a_rs = 2 * K, g.a_cs = 2;
  const auto A = [&](int64_t i, int64_t k) { return p.a[i * g.a_rs + k * g.a_cs]; };
  // B(k, j) stored [K, N] (layout 0), [N, K] (1) or [K, N + 3] (3: conv2d's 1x1 input planes, b_direct);
  // the prepacked form is built from layout 0
  const int64_t b_rs = c.b_layout == 1 ? 1 : c.b_layout == 3 ? N + 3 : N, b_cs = c.b_layout == 1 ? K : 1;
  const auto B = [&](int64_t k, int64_t j) { return p.b[k * b_rs + j * b_cs]; };
  if (c.b_layout == 2) {
    const int64_t P = etfuse::core::gemm::kPanel;
    p.packed.assign(static_cast<size_t>(etfuse::core::gemm::packed_panels(N) * K * P), 0.0f);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) p.packed[(j / P) * K * P + k * P + j % P] = B(k, j);
    g.packed_b = p.packed.data();
  } else {
    g.B = p.b.data(), g.b_rs = b_rs, g.b_cs = b_cs;
    g.b_direct = c.b_layout == 3;
  }
  if (c.c_transposed) g.c_rs = 1, g.c_cs = M;
  else g.c_rs = N, g.c_cs = 1;
  g.clamp = c.clamp;
  g.act_min = -0.5f, g.act_max = 0.75f;
  if (c.epilogue) {
    if (!c.no_scale) g.scale = p.scale.data(), g.scale_rs = c.column_scale ? 0 : 1, g.scale_cs = c.column_scale ? 1 : 0;
    g.bias = p.bias.data(), g.bias_rs = 0, g.bias_cs = 1;
    g.residual = p.residual.data(), g.residual_rs = g.c_rs, g.residual_cs = g.c_cs;
  }
  p.want.resize(static_cast<size_t>(M * N)), p.tol.resize(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        sum += double(A(i, k)) * double(B(k, j));
        magnitude += std::fabs(double(A(i, k)) * double(B(k, j)));
      }
      double want = sum;
      const float sc = c.no_scale ? 1.0f : p.scale[c.column_scale ? j : i];
      if (c.epilogue) want = want * sc + p.bias[j] + p.residual[i * g.c_rs + j * g.c_cs];
      if (c.clamp) want = want < g.act_min ? g.act_min : (want > g.act_max ? g.act_max : want);
      p.want[i * N + j] = want;
      p.tol[i * N + j] = 1e-5 * (magnitude * (c.epilogue ? std::fabs(sc) + 1 : 1) + 1);
    }
  }
  return p;
}

// gemm::run on the ISA now forced, against the reference.
bool check(const Problem& p, const Case& c, const char* isa) {
  Args g = p.g;
  std::vector<float> out(static_cast<size_t>(g.M * g.N), 12345.0f);
  g.C = out.data();
  etfuse::core::gemm::run(g, [](int64_t begin, int64_t end, int64_t, auto&& fn) { fn(begin, end); });
  for (int64_t i = 0; i < g.M; ++i) {
    for (int64_t j = 0; j < g.N; ++j) {
      const double got = out[i * g.c_rs + j * g.c_cs], want = p.want[i * g.N + j];
      if (!(std::fabs(got - want) <= p.tol[i * g.N + j])) {
        std::printf("MISMATCH isa=%s M=%lld N=%lld K=%lld a_layout=%d b_layout=%d c_transposed=%d epilogue=%d "
                    "clamp=%d column_scale=%d no_scale=%d at (%lld, %lld): got %.7g, want %.7g\n",
                    isa, (long long)g.M, (long long)g.N, (long long)g.K, c.a_layout, c.b_layout, int(c.c_transposed),
                    int(c.epilogue), int(c.clamp), int(c.column_scale), int(c.no_scale), (long long)i, (long long)j, got, want);
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main() {
  const int64_t rows[] = {1, 2, 3, 4, 5, 7, 13, 37, 100};
  const int64_t cols[] = {1, 7, 16, 17, 40, 70};
  const int64_t depths[] = {1, 3, 4, 9, 64, 300};
  // every case on every ISA before the next: its inputs and reference made once (the reference
  // was most of the run under qemu and at -O0)
  return check_isa_loop::check_cases_on_every_isa({"baseline", "avx2", "avx512", "neon"}, [&](auto&& on_every_isa) {
    const auto run_case = [&](const Case& c) {
      const Problem p = prepare(c);
      return on_every_isa([&](const char* isa) { return check(p, c, isa); });
    };
    for (int64_t M : rows)
      for (int64_t N : cols)
        for (int64_t K : depths)
          for (int a_layout = 0; a_layout < 3; ++a_layout)
            for (int b_layout = 0; b_layout < 4; ++b_layout)
              for (int variant = 0; variant < 5; ++variant)
                if (!run_case(Case{M, N, K, a_layout, b_layout, variant == 1 || variant == 3, variant != 0, variant >= 2,
                                   variant == 3, variant == 4}))
                  return false;
    // C transposed on a prepacked B of kPrefetchMinBytes or more (conv2d's run_packed on a big
    // weight): a block's tiles after the first get tiles_impl's prefetch hint
    constexpr int64_t kBigN = 440, kBigK = 300;
    static_assert(kBigN * kBigK * 4 >= etfuse::core::gemm::detail::kPrefetchMinBytes, "a B to prefetch");
    for (int64_t M : {7, 25})
      for (int a_layout = 0; a_layout < 2; ++a_layout)
        for (bool epilogue : {false, true})
          if (!run_case(Case{M, kBigN, kBigK, a_layout, 2, true, epilogue, epilogue, epilogue})) return false;
    return true;
  });
}
