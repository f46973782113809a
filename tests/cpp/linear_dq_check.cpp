// linear_dq::run (core/linear_dq.h) on every ISA this CPU has and this build compiles
// ("baseline", "avx2", "avx512", "avx512vnni" on x86-64; "baseline", "neon", "neondot" on aarch64: the smlal
// and sdot kernels of arch/arm/linear_dq_neon.h) against a scalar reference: each row quantized
// by torchao's steps (row_qparams, quantized), the integer sums D[m, n, g] exact in int64, then
// scaled in double; and against the portable code. 4-bit weights in groups of 32, 64 and 128
// columns (and 96), int8 per channel (K off every vector width) and in a few odd groups, with and
// without zero points, bias and residual; rows 1..9, 64, 67; odd N, split into the column blocks
// run's parallel_for gives. The unit-scale variants are bit-exact: with every weight scale 1 and
// no bias, C[m, n] = float(sum_g D) * s[m] exactly (sums below 2^24), so a sum off by one fails.
// Half the cases pass the weight's row sums (Args::row_sums, as linear_dq's op does: the int8-row
// paths run), half none (the int16 paths run).
// tests/test_linear_dq_isa.py builds it natively and for aarch64 (run under qemu-aarch64).
// Prints one line per ISA checked; exits 1 at the first mismatch, naming it.
//
//   linear_dq_check time ISA BITS M N K GROUPS REPS   REPS runs of one linear on ISA (for
//                                                     counting instructions under qemu)
#include "isa_loop.h"
#include "quantized_weight.h"
#include "core/linear_dq.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ec = etfuse::core;
namespace qw = etfuse::core::linear_qw;
namespace dq = etfuse::core::linear_dq;

namespace {

using check_random::next_bits;
using check_random::next_value;

using quantized_weight::blocks;

struct Case : quantized_weight::Case {
  bool unit;      // every weight scale 1 (the bit-exact variants)
  bool row_sums;  // Args::row_sums given (linear_dq's weight_row_sums), or none
};

struct Problem : quantized_weight::Problem {
  std::vector<float> row_sums;
  qw::Args args(const Case& c, float* out) const {
    qw::Args a = quantized_weight::Problem::args(c, out);
    a.row_sums = c.row_sums ? row_sums.data() : nullptr;
    return a;
  }
};

Problem make(const Case& c) {
  Problem p;
  p.x.resize(static_cast<size_t>(c.M * c.K));
  // rows of different ranges: all positive, all negative, mixed (zx across its range)
  for (int64_t m = 0; m < c.M; ++m) {
    const int kind = static_cast<int>(next_bits() % 3);
    const float span = 0.1f + 4.0f * std::fabs(next_value());
    for (int64_t k = 0; k < c.K; ++k) {
      float v = next_value() * span;
      if (kind == 0) v = std::fabs(v);
      if (kind == 1) v = -std::fabs(v) * 0.5f + 0.01f * span;
      p.x[m * c.K + k] = v;
    }
  }
  quantized_weight::make_weight(c, c.bits == 4 ? 17 : 256, c.unit, p);  // int8 zero points across their range
  p.row_sums.resize(static_cast<size_t>(c.N));
  for (int64_t n = 0; n < c.N; ++n) {
    double sum = 0.0;
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t i = n * c.groups + k / (c.K / c.groups);
      sum += double(p.scales[i]) * (p.q[n * c.K + k] - (c.zp ? p.zp[i] : 0));
    }
    p.row_sums[n] = static_cast<float>(sum);
  }
  return p;
}

std::vector<float> compute(const Case& c, const Problem& p) {
  std::vector<float> out(static_cast<size_t>(c.M * c.N), 12345.0f);
  dq::Scratch scratch;
  dq::run(p.args(c, out.data()), scratch, blocks);
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
  const int64_t G = c.K / c.groups;
  std::vector<int32_t> x(static_cast<size_t>(c.K));
  for (int64_t m = 0; m < c.M; ++m) {
    const float* row = p.x.data() + m * c.K;
    float mn = row[0], mx = row[0];
    for (int64_t k = 1; k < c.K; ++k) mn = std::fmin(mn, row[k]), mx = std::fmax(mx, row[k]);
    const dq::RowQparams rq = dq::row_qparams(mn, mx);
    for (int64_t k = 0; k < c.K; ++k) x[k] = dq::quantized(row[k], rq.inv, rq.zp);
    for (int64_t n = 0; n < c.N; ++n) {
      // magnitude: the terms a kernel sums in float. The int8-row paths sum D' = D + zx * W per
      // group (W = sum (q - zp)) and subtract zx * row_sums[n] once, so their terms count too.
      double want = 0.0, magnitude = 0.0;
      int64_t dtot = 0;
      for (int64_t g = 0; g < c.groups; ++g) {
        int64_t d = 0, wg = 0;
        const int64_t i = n * c.groups + g;
        const int64_t z = c.zp ? p.zp[i] : 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          d += int64_t(x[k]) * (p.q[n * c.K + k] - z);
          wg += p.q[n * c.K + k] - z;
        }
        dtot += d;
        want += double(p.scales[i]) * double(d);
        magnitude += std::fabs(double(p.scales[i]) * double(d));
        if (c.row_sums) magnitude += std::fabs(double(p.scales[i]) * (double(d) + rq.zp * double(wg)));
      }
      if (c.row_sums) magnitude += std::fabs(rq.zp * double(p.row_sums[n]));
      want *= rq.scale;
      magnitude *= rq.scale;
      if (c.bias) want += p.bias[n], magnitude += std::fabs(p.bias[n]);
      if (c.residual) want += p.residual[m * c.N + n], magnitude += std::fabs(p.residual[m * c.N + n]);
      const double v = got[m * c.N + n], v_portable = portable[m * c.N + n];
      bool ok;
      if (c.unit && !c.bias && !c.residual) {
        const float exact = static_cast<float>(dtot) * rq.scale;
        ok = v == exact && v_portable == exact;
        want = exact;
      } else {
        const double tol = 1e-5 * magnitude + 1e-30;
        ok = std::fabs(v - want) <= tol && std::fabs(v - v_portable) <= tol;
      }
      if (!ok) {
        std::printf("MISMATCH isa=%s bits=%d M=%lld N=%lld K=%lld groups=%lld zp=%d bias=%d residual=%d unit=%d "
                    "row_sums=%d at (%lld, %lld): got %.9g, portable %.9g, want %.9g\n",
                    isa, c.bits, (long long)c.M, (long long)c.N, (long long)c.K, (long long)c.groups, int(c.zp),
                    int(c.bias), int(c.residual), int(c.unit), int(c.row_sums), (long long)m, (long long)n, v, v_portable,
                    want);
        return false;
      }
    }
  }
  return true;
}

int check_isa(const char* isa) {
  // (K, groups): 4 bits in groups of 32 (torchao's), 64, 128, 256, 96 and 192, K off AVX-512
  // VNNI's 128-column superblocks by 32, 64 and 96 columns; 8 bits per channel with K off the 8-
  // and 16-wide steps, and in groups of 3, 11 and 32 columns
  const int64_t k4[][2] = {{32, 1},  {64, 2},  {64, 1},  {128, 1}, {256, 2}, {96, 1},
                           {288, 9}, {384, 3}, {192, 3}, {224, 7}, {512, 2}, {384, 2}};
  const int64_t k8[][2] = {{1, 1}, {3, 1}, {7, 1}, {16, 1}, {17, 1}, {24, 1}, {57, 1}, {288, 1},
                           {33, 3}, {99, 9}, {288, 9}};
  const int64_t rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 67};
  const int64_t cols[] = {1, 3, 4, 5, 7, 21, 33};  // 21, 33: gemm_q4's 32-column tiles cut short
  int cases = 0;
  for (int bits : {4, 8}) {
    const auto& ks = bits == 4 ? k4 : k8;
    const size_t nk = bits == 4 ? sizeof(k4) / sizeof(k4[0]) : sizeof(k8) / sizeof(k8[0]);
    for (size_t i = 0; i < nk; ++i)
      for (int64_t M : rows)
        for (int64_t N : cols)
          for (int variant = 0; variant < 5; ++variant) {
            // large M and N only in some variants: the suite's time under qemu
            if (M > 9 && N > 5 && variant != 1 && variant != 3) continue;
            const Case c{{bits, M, N, ks[i][0], ks[i][1], variant >= 1 && variant != 4, variant == 1, variant == 2},
                         variant >= 3, (N + variant) % 2 == 0};
            if (!check(c, isa)) return -1;
            ++cases;
          }
  }
  return cases;
}

int time_mode(char** argv) {
  if (!check_isa_loop::use_isa_or_say(argv[2])) return 1;
  const Case c{{std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]), std::atoll(argv[6]), std::atoll(argv[7]),
                false, true, false},
               false, true};
  const Problem p = make(c);
  std::vector<float> out(static_cast<size_t>(c.M * c.N));
  dq::Scratch scratch;
  const qw::Args a = p.args(c, out.data());
  return check_isa_loop::time_runs(argv[2], std::atoi(argv[8]), out, [&] { dq::run(a, scratch, blocks); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 9 && std::strcmp(argv[1], "time") == 0) return time_mode(argv);
  return check_isa_loop::check_every_isa(check_isa);
}
