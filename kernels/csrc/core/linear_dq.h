// Linear with dynamically quantized activations (etfuse::linear_dq, torchao's 8da4w / 8da8w). Each
// row of A is quantized to int8 once per call, per token and asymmetric, in torchao's float32 steps:
//
//   lo = min(min_k A[m, k], 0), hi = max(max_k A[m, k], 0), s = max((hi - lo) / 255, FLT_MIN)
//   zx = clamp(-128 - rint(lo / s), -128, 127), qx = clamp(rint(A[m, k] * (1 / s)) + zx, -128, 127)
//
// and the weight is what linear_qw reads (int8 [N, K], or pack_int4's nibbles; scales and zero
// points per group of G = K / groups columns, core/linear_qw.h):
//
//   C[m, n] = s[m] * sum_g scale[n, g] * D[m, n, g] + bias[n] + residual[m, n]
//   D[m, n, g] = sum_{k in g} x[m, k] * q[n, k] - zp[n, g] * sum_{k in g} x[m, k],   x = qx - zx
//
// D is exact in int32. Only the scales' products round (float32), where the pattern rounds each
// dequantized element. Two ways to sum it:
//
// * int16 (int8 weights; portable; int4 groups other than 32 or a multiple of 64): x (in
//   [-255, 255]) and q kept as int16, pmaddwd sums pairs of their products (|x q| <= 255 * 128)
//   into int32 lanes; the rows' group sums are taken once per call. A block of 4 weight rows is
//   widened to int16 once into an L1-sized scratch and the rows of A, two at a time, take their
//   dot products over it.
// * int8 rows (x86's q4: int4 weights, AVX2's maddubs, u8 x s8 -> pairs in int16; ARM's sdot, int4
//   and int8 weights): the raw qx (int8) times the weight's integers as stored (the nibbles
//   u = q + 8 unsigned, or int8 q), then per group
//
//     D' = sum u qx - (8 + zp) * sum qx    (o = 8 for nibbles, 0 for int8)
//
//   and C[m, n] = s[m] * (sum_g scale[n, g] * D' - zx * r[n]) + ..., with r[n] the dequantized
//   weight row's sum, sum_k (q - zp) * scale (Args::row_sums, linear_dq's weight_row_sums, made at
//   fuse time, one float a column). That is the same C, as sum_g scale D = sum_g scale D' - zx r:
//   the zx term leaves the integer sums and is taken once per column, in float (XNNPACK's qd8
//   kernels fold it the same way), so the weight's stream carries no per-group sums. sum qx is the
//   rows' (once per call). maddubs multiplies unsigned by signed bytes: u fits the one, qx the
//   other (x = qx - zx, 9 bits, fits neither), and a pair of their products, at most 2 * 15 * 128,
//   fits int16.
//
// The per-ISA copies are compiled once per library, in
// core/kernels.cpp (-DETFUSE_CORE_KERNELS): core/linear_dq_rows.h over the primitives of
// core/linear_dq_portable.h, arch/x86/linear_dq_avx2.h or arch/x86/linear_dq_avx512vnni.h.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "common.h"
#include "linear_qw.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>  // at file scope: the per-ISA copies below are included inside namespaces
#endif
#if ETFUSE_HAVE_ARM_NEON
#include <arm_neon.h>  // likewise
// the sdot kernels: compiled for ARMv8.2 with dot products alone, the library stays ARMv8.0
#define ETFUSE_DQ_NEON_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

namespace etfuse {
namespace core {
namespace linear_dq {

using Args = linear_qw::Args;
constexpr int64_t kChunk = linear_qw::kChunk;  // pack_int4's 32-column chunks
constexpr int kCols = 4;                       // weight rows widened and dotted together
constexpr int kQmin = -128, kQmax = 127;

// The rows of A quantized: x = qx - zx, [M, K]; s[m]; the sums of x over each group ([M, groups],
// only where the weight has zero points). The int8-row paths (x86's maddubs on int4, ARM's sdot):
// qx itself (int8 [M, K], in their primitives' order), zx, and in gsum the sums of qx over each group.
struct Rows {
  const int16_t* x = nullptr;
  const float* scale = nullptr;
  const int32_t* gsum = nullptr;
  const int8_t* qx = nullptr;
  const int32_t* zx = nullptr;
};

struct RowQparams {
  float scale, inv, zp;
};

// torchao's choose_qparams_affine (ASYMMETRIC, int8, eps = FLT_MIN) from a row's min and max.
inline RowQparams row_qparams(float mn, float mx) {
  const float lo = mn < 0.0f ? mn : 0.0f, hi = mx > 0.0f ? mx : 0.0f;
  float s = (hi - lo) / static_cast<float>(kQmax - kQmin);
  if (s < FLT_MIN) s = FLT_MIN;
  float zp = static_cast<float>(kQmin) - std::nearbyint(lo / s);
  zp = zp < kQmin ? kQmin : (zp > kQmax ? kQmax : zp);
  return {s, 1.0f / s, zp};
}

// One row's x = clamp(rint(v * inv) + zp, -128, 127) - zp, exactly as quantize_affine's float32 steps.
ETFUSE_ALWAYS_INLINE int16_t quantized(float v, float inv, float zp) {
  float q = std::nearbyint(v * inv) + zp;
  q = q < kQmin ? kQmin : (q > kQmax ? kQmax : q);
  return static_cast<int16_t>(q - zp);
}

// C[m, n] from an int8-row path's sum_g scale[n, g] * D' (the comment at the top).
ETFUSE_ALWAYS_INLINE void store_q8(const Args& a, const Rows& r, int64_t m, int64_t n, float sum) {
  float y = (sum - static_cast<float>(r.zx[m]) * a.row_sums[n]) * r.scale[m];
  if (a.bias) y += a.bias[n];
  if (a.residual) y += a.residual[m * a.r_rs + n];
  a.C[m * a.c_rs + n] = y;
}

void quantize_rows_portable(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum);
void cols_portable(const Args& a, const Rows& r, int64_t j0, int64_t j1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void quantize_rows_avx2(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale,
                                           int32_t* gsum);
ETFUSE_TARGET_AVX2 void cols_avx2(const Args& a, const Rows& r, int64_t j0, int64_t j1);
ETFUSE_TARGET_AVX2 void quantize_rows_q8_avx2(const Args& a, int64_t m0, int64_t m1, int8_t* q, float* scale,
                                              int32_t* zx, int32_t* qsum);
ETFUSE_TARGET_AVX2 void cols_q4_avx2(const Args& a, const Rows& r, int64_t j0, int64_t j1);
ETFUSE_TARGET_VNNI void quantize_rows_q8_vnni(const Args& a, int64_t m0, int64_t m1, int8_t* q, float* scale,
                                              int32_t* zx, int32_t* qsum);
ETFUSE_TARGET_VNNI void cols_q4_vnni(const Args& a, const Rows& r, int64_t j0, int64_t j1);
#endif
#if ETFUSE_HAVE_ARM_NEON
void quantize_rows_neon(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum);
void cols_neon(const Args& a, const Rows& r, int64_t j0, int64_t j1);
ETFUSE_DQ_NEON_DOT void quantize_rows_dot(const Args& a, int64_t m0, int64_t m1, int8_t* qx, float* scale,
                                          int32_t* zx, int32_t* gsum);
ETFUSE_DQ_NEON_DOT void cols_dot(const Args& a, const Rows& r, int64_t j0, int64_t j1);
#endif

#if defined(ETFUSE_CORE_KERNELS)
#include "linear_dq_portable.h"
#define ETFUSE_DQ_NS rows_portable
#define ETFUSE_DQ_PRIMITIVES portable
#include "linear_dq_rows.h"

#if ETFUSE_HAVE_X86_DISPATCH
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "arch/x86/linear_dq_avx2.h"
#define ETFUSE_DQ_NS rows_avx2
#define ETFUSE_DQ_PRIMITIVES avx2
#define ETFUSE_DQ_Q8
#define ETFUSE_DQ_Q4
#include "linear_dq_rows.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "arch/x86/linear_dq_avx512vnni.h"
#define ETFUSE_DQ_NS rows_vnni
#define ETFUSE_DQ_PRIMITIVES vnni
#define ETFUSE_DQ_Q8
#define ETFUSE_DQ_Q4
#include "linear_dq_rows.h"
#pragma GCC pop_options
#endif

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/linear_dq_neon.h"
#define ETFUSE_DQ_NS rows_neon
#define ETFUSE_DQ_PRIMITIVES neon
#define ETFUSE_DQ_Q8
#include "linear_dq_rows.h"

void quantize_rows_neon(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum) {
  rows_neon::quantize_rows(a, m0, m1, x, scale, gsum);
}
void cols_neon(const Args& a, const Rows& r, int64_t j0, int64_t j1) { rows_neon::cols(a, r, j0, j1); }
ETFUSE_DQ_NEON_DOT void quantize_rows_dot(const Args& a, int64_t m0, int64_t m1, int8_t* qx, float* scale,
                                          int32_t* zx, int32_t* gsum) {
  rows_neon::quantize_rows_q8(a, m0, m1, qx, scale, zx, gsum);
}
ETFUSE_DQ_NEON_DOT void cols_dot(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  if (a.bits == 4) {
    neon::cols_dot<4>(a, r, j0, j1);
  } else {
    neon::cols_dot<8>(a, r, j0, j1);
  }
}
#endif

void quantize_rows_portable(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum) {
  rows_portable::quantize_rows(a, m0, m1, x, scale, gsum);
}
void cols_portable(const Args& a, const Rows& r, int64_t j0, int64_t j1) { rows_portable::cols(a, r, j0, j1); }
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void quantize_rows_avx2(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale,
                                           int32_t* gsum) {
  rows_avx2::quantize_rows(a, m0, m1, x, scale, gsum);
}
ETFUSE_TARGET_AVX2 void cols_avx2(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  rows_avx2::cols(a, r, j0, j1);
}
ETFUSE_TARGET_AVX2 void quantize_rows_q8_avx2(const Args& a, int64_t m0, int64_t m1, int8_t* q, float* scale,
                                              int32_t* zx, int32_t* qsum) {
  rows_avx2::quantize_rows_q8(a, m0, m1, q, scale, zx, qsum);
}
ETFUSE_TARGET_AVX2 void cols_q4_avx2(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  rows_avx2::cols_q4(a, r, j0, j1);
}
ETFUSE_TARGET_VNNI void quantize_rows_q8_vnni(const Args& a, int64_t m0, int64_t m1, int8_t* q, float* scale,
                                              int32_t* zx, int32_t* qsum) {
  rows_vnni::quantize_rows_q8(a, m0, m1, q, scale, zx, qsum);
}
ETFUSE_TARGET_VNNI void cols_q4_vnni(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  if (vnni::gemm_takes(a)) {
    vnni::gemm_q4(a, r, j0, j1);
  } else {
    rows_vnni::cols_q4(a, r, j0, j1);
  }
}
#endif
#endif

// linear_dq's kernels on one ISA: the one place they are chosen. AVX-512 takes the AVX2 copies,
// AVX-512 VNNI the same with its own int4 path (vpdpbusd); aarch64 the NEON ones
// (arch/arm/linear_dq_neon.h). An ISA's int8-row path (rows kept as int8 qx) runs the calls its
// `int8_rows` predicate takes; the others take the int16 path.
struct Kernels {
  void (*quantize_rows)(const Args&, int64_t, int64_t, int16_t*, float*, int32_t*);
  void (*cols)(const Args&, const Rows&, int64_t, int64_t);
  void (*quantize_rows_q8)(const Args&, int64_t, int64_t, int8_t*, float*, int32_t*, int32_t*) = nullptr;
  void (*cols_q8)(const Args&, const Rows&, int64_t, int64_t) = nullptr;
  bool (*int8_rows)(const Args&) = nullptr;
};

#if ETFUSE_HAVE_X86_DISPATCH
// maddubs takes int4 weights with the fused row sums, in groups of 32 or multiples of 64
inline bool maddubs_takes(const Args& a) {
  const int64_t G = a.K / a.groups;
  return a.bits == 4 && a.row_sums && (G == 32 || G % 64 == 0);
}
#endif
// the int8-row paths need the weight's row sums (linear_dq's op always gives them)
inline bool has_row_sums(const Args& a) { return a.row_sums != nullptr; }

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
      return {&quantize_rows_avx2, &cols_avx2, &quantize_rows_q8_vnni, &cols_q4_vnni, &maddubs_takes};
    case Isa::kAvx512:
    case Isa::kAvx2: return {&quantize_rows_avx2, &cols_avx2, &quantize_rows_q8_avx2, &cols_q4_avx2, &maddubs_takes};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot: return {&quantize_rows_neon, &cols_neon, &quantize_rows_dot, &cols_dot, &has_row_sums};
    case Isa::kNeon: return {&quantize_rows_neon, &cols_neon};
#endif
    default: return {&quantize_rows_portable, &cols_portable};
  }
}

// The quantized rows, reused across calls by the caller.
struct Scratch {
  std::vector<int16_t> x;
  std::vector<float> scale;
  std::vector<int32_t> gsum;
  std::vector<int8_t> qx;
  std::vector<int32_t> zx;
};

// Column blocks of about 64K multiply-adds, whole blocks of kCols (as linear_qw's).
template <class Cols, class Par>
inline void run_cols(const Args& a, Par&& par, Cols&& cols) {
  int64_t grain = ((int64_t(1) << 16) / (a.M * a.K) + kCols - 1) / kCols * kCols;
  if (grain < kCols) grain = kCols;
  if (a.N <= grain) {
    cols(int64_t(0), a.N);
    return;
  }
  par(0, a.N, grain, [&](int64_t begin, int64_t end) { cols(begin, end); });
}

template <class Quantize, class Par>
inline void run_rows(const Args& a, Par&& par, Quantize&& quantize) {
  if (a.M * a.K <= kSerialElements) {
    quantize(int64_t(0), a.M);
  } else {
    par(0, a.M, std::max<int64_t>(1, kGrainSize / a.K), [&](int64_t begin, int64_t end) { quantize(begin, end); });
  }
}

// Runs the linear described by `a` (validated by the caller; K > 0).
template <class Par>
inline void run(const Args& a, Scratch& s, Par&& par) {
  if (a.M <= 0 || a.N <= 0) return;
  const Kernels kern = kernels(selected_isa());
  if (kern.int8_rows && kern.int8_rows(a)) {
    s.qx.resize(static_cast<size_t>(a.M * a.K));
    s.scale.resize(static_cast<size_t>(a.M));
    s.zx.resize(static_cast<size_t>(a.M));
    s.gsum.resize(static_cast<size_t>(a.M * a.groups));
    Rows rows;
    rows.qx = s.qx.data();
    rows.scale = s.scale.data();
    rows.zx = s.zx.data();
    rows.gsum = s.gsum.data();
    run_rows(a, par, [&](int64_t m0, int64_t m1) {
      kern.quantize_rows_q8(a, m0, m1, s.qx.data(), s.scale.data(), s.zx.data(), s.gsum.data());
    });
    run_cols(a, par, [&](int64_t j0, int64_t j1) { kern.cols_q8(a, rows, j0, j1); });
    return;
  }
  s.x.resize(static_cast<size_t>(a.M * a.K));
  s.scale.resize(static_cast<size_t>(a.M));
  s.gsum.resize(a.zp ? static_cast<size_t>(a.M * a.groups) : 0);
  int16_t* x = s.x.data();
  float* scale = s.scale.data();
  int32_t* gsum = a.zp ? s.gsum.data() : nullptr;
  run_rows(a, par, [&](int64_t m0, int64_t m1) { kern.quantize_rows(a, m0, m1, x, scale, gsum); });
  Rows rows;
  rows.x = x;
  rows.scale = scale;
  rows.gsum = gsum;
  run_cols(a, par, [&](int64_t j0, int64_t j1) { kern.cols(a, rows, j0, j1); });
}

}  // namespace linear_dq
}  // namespace core
}  // namespace etfuse
