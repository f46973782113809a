// Linear with weight-only quantized weights (etfuse::linear_qw), float32 activations:
//
//   C[m, n] = sum_k A[m, k] * ((q[n, k] - zp[n, g]) * scale[n, g]) + bias[n] + residual[m, n],  g = k / G
//
// q is int8 [N, K] (bits 8, stored as torchao stores it) or 4-bit values packed two per byte
// (bits 4, by etfuse::pack_int4): in every 32-column chunk, byte i (0..15) holds column i in its
// low nibble and column 16 + i in its high nibble, each as q + 8. One 16-byte load then gives 32
// weights with one `and` and one shift, in column order.
//
// Decode (M <= 4 rows): dot products, 4 weight rows at a time, converted to float in registers
// as they stream past (the weight is read once, in its packed size: a quarter or an eighth of
// the float weight). Within a group the sum of x * q runs unscaled; the group's scale multiplies
// the partial sum once; a zero point subtracts zp * scale * sum(x over the group), the sums of x
// taken once per call. Prefill (more rows): the float GEMM (gemm.h) with a packer that
// dequantizes each [KC, NR] panel as it fills it. The per-ISA entry points are compiled once per
// library, in core/kernels.cpp (-DETFUSE_CORE_KERNELS).
#pragma once

#include <vector>

#include "common.h"
#include "gemm.h"

#if ETFUSE_HAVE_X86_DISPATCH
// here, at file scope: linear_qw_dot.h is included inside a namespace, and its own include
// would put the intrinsics' types there (and hide them from every header included later)
#include <immintrin.h>
#endif

namespace etfuse {
namespace core {
namespace linear_qw {

constexpr int64_t kChunk = 32;  // columns per packed 4-bit chunk (16 bytes)
constexpr int64_t kDotRows = 4;  // up to this many rows: dot products on the quantized weight
constexpr int64_t kRowsMax = 64;  // up to this many: dot products on dequantized blocks; more: the GEMM
// NEON: the GEMM's 4x16 tile over the dequantizing packer takes fewer instructions than the
// blocks' 2x4 dot products from 7 rows on (64 rows: 1.8x fewer)
constexpr int64_t kRowsMaxNeon = 6;

struct Args {
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;  // [M, K], rows a_rs apart, columns contiguous
  int64_t a_rs = 0;
  const uint8_t* W = nullptr;  // weight rows w_rs bytes apart (K for bits 8, K / 2 for bits 4)
  int64_t w_rs = 0;
  int bits = 8;
  const float* scales = nullptr;  // [N, groups], contiguous
  int64_t groups = 1;             // G = K / groups columns each
  const int8_t* zp = nullptr;     // [N, groups] or null (symmetric)
  const float* bias = nullptr;    // [N] or null
  float* C = nullptr;             // [M, N], rows c_rs apart, columns contiguous
  int64_t c_rs = 0;
  const float* residual = nullptr;  // [M, N] added to the sums (rows r_rs apart, columns contiguous) or null
  int64_t r_rs = 0;
  const float* xsum = nullptr;    // [M, groups]: sum of A over each group (set by run when zp)
  const float* row_sums = nullptr;  // linear_dq: [N], each dequantized weight row's sum (sum_k (q - zp) * scale)
};

// The dequantized weight element (n, k), as the pattern computes it.
ETFUSE_ALWAYS_INLINE float weight_at(const Args& a, int64_t n, int64_t k) {
  const uint8_t* row = a.W + n * a.w_rs;
  int q;
  if (a.bits == 8) {
    q = static_cast<int8_t>(row[k]);
  } else {
    const int64_t i = k % kChunk;
    const uint8_t b = row[(k / kChunk) * (kChunk / 2) + (i & 15)];
    q = (i < 16 ? (b & 15) : (b >> 4)) - 8;
  }
  const int64_t g = k / (a.K / a.groups);
  const int z = a.zp ? a.zp[n * a.groups + g] : 0;
  return static_cast<float>(q - z) * a.scales[n * a.groups + g];
}

// etfuse::pack_int4: int8 values in [-8, 7], rows of k (a multiple of kChunk) -> the layout above.
inline void pack4(const int8_t* q, int64_t rows, int64_t k, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = q + r * k;
    uint8_t* dst = out + r * (k / 2);
    for (int64_t c = 0; c < k; c += kChunk)
      for (int64_t i = 0; i < kChunk / 2; ++i)
        dst[c / 2 + i] = static_cast<uint8_t>(((src[c + i] + 8) & 15) | (((src[c + 16 + i] + 8) & 15) << 4));
  }
}

// The float GEMM over A, C and the bias, B left to the caller (a packer, or dequantized rows).
inline gemm::Args float_gemm(const Args& a) {
  gemm::Args g;
  g.M = a.M;
  g.N = a.N;
  g.K = a.K;
  g.A = a.A;
  g.a_rs = a.a_rs;
  g.a_cs = 1;
  g.C = a.C;
  g.c_rs = a.c_rs;
  g.c_cs = 1;
  g.bias = a.bias;
  g.bias_cs = a.bias ? 1 : 0;
  g.residual = a.residual;
  g.residual_rs = a.r_rs;
  g.residual_cs = 1;
  g.clamp = false;
  return g;
}

}  // namespace linear_qw
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/linear_qw_neon.h"
#endif

namespace etfuse {
namespace core {
namespace linear_qw {

void dot_cols_baseline(const Args& a, int64_t j0, int64_t j1);
void rows_cols_baseline(const Args& a, int64_t j0, int64_t j1);
#if ETFUSE_HAVE_ARM_NEON
void dot_cols_neon(const Args& a, int64_t j0, int64_t j1);
void rows_cols_neon(const Args& a, int64_t j0, int64_t j1);
void pack_panel_neon(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack);
#endif
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void dot_cols_avx2(const Args& a, int64_t j0, int64_t j1);
ETFUSE_TARGET_AVX512 void dot_cols_avx512(const Args& a, int64_t j0, int64_t j1);
ETFUSE_TARGET_AVX2 void rows_cols_avx2(const Args& a, int64_t j0, int64_t j1);
ETFUSE_TARGET_AVX512 void rows_cols_avx512(const Args& a, int64_t j0, int64_t j1);
#endif
void pack_panel(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack);

#if defined(ETFUSE_CORE_KERNELS)
// The dot kernels, once per ISA: linear_qw_dot.h with its vector width and namespace, the AVX2
// and AVX-512 ones under `#pragma GCC target` so that their int8 -> float intrinsics inline.
#define ETFUSE_QW_NS dot_baseline
#define ETFUSE_QW_W 4
#include "linear_qw_dot.h"
#undef ETFUSE_QW_NS
#undef ETFUSE_QW_W

#if ETFUSE_HAVE_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ETFUSE_QW_AVX2 1
#define ETFUSE_QW_NS dot_avx2
#define ETFUSE_QW_W 8
#include "linear_qw_dot.h"
#undef ETFUSE_QW_NS
#undef ETFUSE_QW_W
#undef ETFUSE_QW_AVX2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#define ETFUSE_QW_AVX512 1
#define ETFUSE_QW_NS dot_avx512
#define ETFUSE_QW_W 16
#include "linear_qw_dot.h"
#undef ETFUSE_QW_NS
#undef ETFUSE_QW_W
#undef ETFUSE_QW_AVX512
#pragma GCC pop_options
#endif

void dot_cols_baseline(const Args& a, int64_t j0, int64_t j1) {
  dot_baseline::dot_cols(a, j0, j1);
}
void rows_cols_baseline(const Args& a, int64_t j0, int64_t j1) {
  dot_baseline::rows_cols(a, j0, j1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void dot_cols_avx2(const Args& a, int64_t j0, int64_t j1) {
  dot_avx2::dot_cols(a, j0, j1);
}
ETFUSE_TARGET_AVX512 void dot_cols_avx512(const Args& a, int64_t j0, int64_t j1) {
  dot_avx512::dot_cols(a, j0, j1);
}
ETFUSE_TARGET_AVX2 void rows_cols_avx2(const Args& a, int64_t j0, int64_t j1) {
  dot_avx2::rows_cols(a, j0, j1);
}
ETFUSE_TARGET_AVX512 void rows_cols_avx512(const Args& a, int64_t j0, int64_t j1) {
  dot_avx512::rows_cols(a, j0, j1);
}
#endif

#if ETFUSE_HAVE_ARM_NEON
void dot_cols_neon(const Args& a, int64_t j0, int64_t j1) {
  if (a.bits == 4) {
    arm::dot_cols<4>(a, j0, j1);
  } else {
    arm::dot_cols<8>(a, j0, j1);
  }
}

// As the portable rows_cols: 4 weight rows dequantized into a scratch, the float dot products over it.
void rows_cols_neon(const Args& a, int64_t j0, int64_t j1) {
  std::vector<float> scratch(static_cast<size_t>(4 * a.K));
  gemm::Args g = float_gemm(a);
  g.b_rs = 1;
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    const float* b[4];
    for (int c = 0; c < 4; ++c) {
      if (c < nj) {
        float* row = scratch.data() + c * a.K;
        if (a.bits == 4) {
          arm::dequantize_row<4>(a, j + c, 0, a.K, row);
        } else {
          arm::dequantize_row<8>(a, j + c, 0, a.K, row);
        }
      }
      b[c] = scratch.data() + (c < nj ? c : 0) * a.K;
    }
    int64_t i = 0;
    for (; i + 2 <= a.M; i += 2) gemm::detail::dot_block<4, 2>(g, i, j, nj, b);
    if (i < a.M) gemm::detail::dot_block<4, 1>(g, i, j, nj, b);
  }
}

void pack_panel_neon(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack) {
  const Args& a = *static_cast<const Args*>(ctx);
  if (NR % 4 != 0) {
    pack_panel(ctx, k0, kc, j0, nr, NR, pack);
  } else if (a.bits == 4) {
    arm::pack_panel<4>(a, k0, kc, j0, nr, NR, pack);
  } else {
    arm::pack_panel<8>(a, k0, kc, j0, nr, NR, pack);
  }
}
#endif

// gemm::Args::pack: pack[k][j] = dequantized weight (j0 + j, k0 + k), zero past nr.
void pack_panel(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack) {
  const Args& a = *static_cast<const Args*>(ctx);
  for (int64_t j = 0; j < NR; ++j) {
    if (j >= nr) {
      for (int64_t k = 0; k < kc; ++k) pack[k * NR + j] = 0.0f;
      continue;
    }
    for (int64_t k = 0; k < kc; ++k) pack[k * NR + j] = weight_at(a, j0 + j, k0 + k);
  }
}
#endif

// linear_qw's kernels on one ISA: the one place they are chosen (AVX-512 where the CPU has it:
// the 4-bit decode is bound by unpacking, not by memory; NEON with or without dot products:
// the same float kernels, arch/arm/linear_qw_neon.h).
struct Kernels {
  void (*dot_cols)(const Args&, int64_t, int64_t);   // few rows: one dot product per column
  void (*rows_cols)(const Args&, int64_t, int64_t);  // more rows
  void (*pack_panel)(const void*, int64_t, int64_t, int64_t, int64_t, int64_t, float*);  // many rows: the GEMM's packer
  int64_t rows_max;  // rows_cols up to this many rows, the GEMM past it
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512: return {&dot_cols_avx512, &rows_cols_avx512, &pack_panel, kRowsMax};
    case Isa::kAvx2: return {&dot_cols_avx2, &rows_cols_avx2, &pack_panel, kRowsMax};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {&dot_cols_neon, &rows_cols_neon, &pack_panel_neon, kRowsMaxNeon};
#endif
    default: return {&dot_cols_baseline, &rows_cols_baseline, &pack_panel, kRowsMax};
  }
}

// Runs the linear described by `a` (validated by the caller). `xsum` is scratch for the zero
// points' sums of x.
template <class Par>
inline void run(Args a, std::vector<float>& xsum, Par&& par) {
  if (a.M <= 0 || a.N <= 0) return;
  const bool few = a.M <= kDotRows;
  const Kernels kern = kernels(selected_isa());
  if (a.M > kern.rows_max) {
    gemm::Args g = float_gemm(a);
    g.pack = kern.pack_panel;
    g.pack_ctx = &a;
    gemm::run(g, par);
    return;
  }
  if (a.zp && few) {
    const int64_t G = a.K / a.groups;
    xsum.resize(static_cast<size_t>(a.M * a.groups));
    for (int64_t m = 0; m < a.M; ++m)
      for (int64_t g = 0; g < a.groups; ++g) {
        float s = 0.0f;
        for (const float *x = a.A + m * a.a_rs + g * G, *end = x + G; x < end; ++x) s += *x;
        xsum[m * a.groups + g] = s;
      }
    a.xsum = xsum.data();
  }
  const auto dot = few ? kern.dot_cols : kern.rows_cols;
  // column blocks of about 64K multiply-adds, a multiple of 4 columns (256K kept the tiny
  // llama's 288 x 768 linears, 2.5x slower per weight than float ones, on one thread)
  int64_t grain = ((int64_t(1) << 16) / (a.M * a.K) + 3) / 4 * 4;
  if (grain < 4) grain = 4;
  if (a.N <= grain) {
    dot(a, 0, a.N);
    return;
  }
  par(0, a.N, grain, [&](int64_t begin, int64_t end) { dot(a, begin, end); });
}

}  // namespace linear_qw
}  // namespace core
}  // namespace etfuse
