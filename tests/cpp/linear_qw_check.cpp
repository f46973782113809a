// linear_qw::run (core/linear_qw.h) on every ISA this CPU has and this build compiles
// ("baseline", "avx2", "avx512" on x86-64; "baseline", "neon", "neondot" on aarch64, the NEON
// kernels of arch/arm/linear_qw_neon.h), against the pattern's math in double (weight_at: the
// dequantized weight) and against the portable code: 4-bit weights in groups of 32, 64 and 96
// columns, int8 per channel and in groups of odd sizes (K off every vector width), with and
// without zero points, bias and residual; rows 1..9 (decode's dot products up to 4, the dequantized
// blocks after), 64 and past it (the GEMM with the dequantizing packer); odd N, split into the
// column blocks run's parallel_for gives. tests/test_linear_qw_isa.py builds it natively and for
// aarch64 (run under qemu-aarch64). Prints one line per ISA checked; exits 1 at the first
// mismatch, naming it.
//
//   linear_qw_check time ISA BITS M N K GROUPS REPS   REPS runs of one linear on ISA (for
//                                                     counting instructions under qemu)
#include "isa_loop.h"
#include "quantized_weight.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ec = etfuse::core;
namespace qw = etfuse::core::linear_qw;

namespace {

using check_random::next_value;

using quantized_weight::blocks;
using quantized_weight::Case;
using quantized_weight::Problem;

Problem make(const Case& c) {
  Problem p;
  p.x.resize(static_cast<size_t>(c.M * c.K));
  for (auto& v : p.x) v = next_value();
  quantized_weight::make_weight(c, 17, false, p);
  return p;
}

std::vector<float> compute(const Case& c, const Problem& p) {
  std::vector<float> out(static_cast<size_t>(c.M * c.N), 12345.0f), xsum;
  qw::run(p.args(c, out.data()), xsum, blocks);
  return out;
}

bool check(const Case& c, const char* isa) {
  const Problem p = make(c);
  const std::vector<float> got = compute(c, p);
  std::vector<float> portable = got;
  if (std::strcmp(isa, "baseline") != 0) {
    ec::set_isa("baseline");
    portable = compute(c, p);
    ec::set_isa(isa);
  }
  // the pattern's weight, and the size of each product's parts (x * q, and the zero point's sums
  // of x, taken apart from it in decode) for the tolerance
  const qw::Args a = p.args(c, nullptr);
  const int64_t G = c.K / c.groups;
  std::vector<double> w(static_cast<size_t>(c.N * c.K)), size(w.size());
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t i = n * c.groups + k / G;
      w[n * c.K + k] = qw::weight_at(a, n, k);
      size[n * c.K + k] = p.scales[i] * ((c.bits == 4 ? 8.0 : 128.0) + (c.zp ? std::abs(p.zp[i]) : 0));
    }
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      double want = 0.0, magnitude = 1.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double x = p.x[m * c.K + k];
        want += x * w[n * c.K + k];
        magnitude += std::fabs(x) * size[n * c.K + k];
      }
      if (c.bias) want += p.bias[n];
      if (c.residual) want += p.residual[m * c.N + n];
      const double tol = 2e-6 * magnitude;
      const double v = got[m * c.N + n], v_portable = portable[m * c.N + n];
      if (!(std::fabs(v - want) <= tol && std::fabs(v - v_portable) <= tol)) {
        std::printf("MISMATCH isa=%s bits=%d M=%lld N=%lld K=%lld groups=%lld zp=%d bias=%d residual=%d at (%lld, %lld): "
                    "got %.7g, portable %.7g, want %.7g\n",
                    isa, c.bits, (long long)c.M, (long long)c.N, (long long)c.K, (long long)c.groups, int(c.zp),
                    int(c.bias), int(c.residual), (long long)m, (long long)n, v, v_portable, want);
        return false;
      }
    }
  }
  return true;
}

int check_isa(const char* isa) {
  // (K, groups): 4 bits in groups of 32 (torchao's), 64 and 96 (3 chunks); 8 bits per channel
  // with K off the 16- and 8-wide steps, and in groups of 1, 3, 11, 25 and 32 columns
  const int64_t k4[][2] = {{32, 1}, {64, 2}, {64, 1}, {96, 1}, {192, 2}, {288, 9}, {320, 5}};
  const int64_t k8[][2] = {{1, 1}, {3, 1}, {7, 1}, {8, 1}, {17, 1}, {24, 1}, {40, 1}, {57, 1},
                           {288, 1}, {9, 3}, {33, 3}, {100, 4}, {288, 9}};
  const int64_t rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 67};
  const int64_t cols[] = {1, 3, 4, 5, 7, 13, 33};
  int cases = 0;
  for (int bits : {4, 8}) {
    const auto& ks = bits == 4 ? k4 : k8;
    const size_t nk = bits == 4 ? sizeof(k4) / sizeof(k4[0]) : sizeof(k8) / sizeof(k8[0]);
    for (size_t i = 0; i < nk; ++i)
      for (int64_t M : rows)
        for (int64_t N : cols)
          for (int variant = 0; variant < 3; ++variant) {
            // large M and N with the longest K only in some variants: the suite's time under qemu
            if (M > 9 && N > 5 && variant != 1) continue;
            const Case c{bits, M, N, ks[i][0], ks[i][1], variant >= 1, variant == 1, variant == 2};
            if (!check(c, isa)) return -1;
            ++cases;
          }
  }
  return cases;
}

int time_mode(char** argv) {
  if (!check_isa_loop::use_isa_or_say(argv[2])) return 1;
  const Case c{std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]), std::atoll(argv[6]), std::atoll(argv[7]),
               false, true, false};
  const Problem p = make(c);
  std::vector<float> out(static_cast<size_t>(c.M * c.N)), xsum;
  const qw::Args a = p.args(c, out.data());
  return check_isa_loop::time_runs(argv[2], std::atoi(argv[8]), out, [&] { qw::run(a, xsum, blocks); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 9 && std::strcmp(argv[1], "time") == 0) return time_mode(argv);
  return check_isa_loop::check_every_isa(check_isa);
}
