// The portable pieces of the int8 ops' float path (ops/quantized_gemm.h) and the choosers that
// pick their per-ISA copies (arch/x86/quantized_gemm_avx2.h, arch/arm/quantized_gemm_neon.h):
//   * integers: 8-bit values -> exact float integers (q - zp);
//   * requant_rows: float sums -> the quantized output,
//       out = clamp(rint((acc * scale[c] + bias[c]) * inv) + zp, lo, hi)
//     one float32 operation at a time, never contracted into an FMA (bit-exact with the op's
//     pattern, and with the int8 kernels' epilogues, int8_epilogue.h, arch/arm/int8_neon.h);
//   * panels_rows: a few rows times the packed ops' int8 GEMM panels (a GEMV that reads the
//     weight once).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/common.h"
#include "core/gemm.h"
#include "core/int8_epilogue.h"
#include "core/quantized.h"

namespace etfuse {
namespace core {
namespace int8_gemm {

using Requant = int8_epilogue::Requant;
constexpr int64_t kPanel = gemm::kPanel;

template <class T>
inline void integers_base(const T* q, int64_t n, float zp, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) - zp;
}

// `n` values of one channel c (conv: a channel's pixels), or one value per channel (linear: a row).
template <class T, bool kPerElementChannel>
ETFUSE_ALWAYS_INLINE void requant_loop(const float* __restrict acc, int64_t n, int64_t c, const Requant& r,
                                       T* __restrict q) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ch = kPerElementChannel ? i : c;
    float y = acc[i] * r.scale[ch];
    if (r.bias) y = y + r.bias[ch];
    q[i] = static_cast<T>(static_cast<int32_t>(quantized::clampf(std::rint(y * r.inv) + r.zp, r.lo, r.hi)));
  }
}

// requant_loop over values [i, n) of a row: the tail of the vector copies' loops.
template <class T, bool kPer>
ETFUSE_ALWAYS_INLINE void requant_tail(const float* acc, int64_t i, int64_t n, int64_t c, const Requant& r, T* q) {
  Requant rest = r;
  if (kPer) {
    rest.scale = r.scale + i;
    rest.bias = r.bias ? r.bias + i : nullptr;
  }
  requant_loop<T, kPer>(acc + i, n - i, kPer ? 0 : c, rest, q + i);
}

// `rows` rows of `inner` values, row i of channel (row0 + i) % channels (conv: a block of an
// [N, C, pixels] output); or, with kPer, rows of one value per channel (linear: row i is [channels]).
template <class T, bool kPer>
ETFUSE_NO_FP_CONTRACT void requant_rows_base(const float* acc, int64_t rows, int64_t inner, int64_t row0,
                                             int64_t channels, const Requant& r, T* q) {
  for (int64_t i = 0; i < rows; ++i) {
    requant_loop<T, kPer>(acc + i * inner, inner, kPer ? 0 : (row0 + i) % channels, r, q + i * inner);
  }
}

// acc[R, N] = x[R, K] (rows x_rs apart) @ int8 panels [p0, p1) ([N16 / 16][K][16]).
template <int R>
inline void panels_rows_base(const float* x, int64_t x_rs, int64_t K, const int8_t* w, int64_t p0, int64_t p1,
                             float* acc, int64_t N) {
  for (int64_t p = p0; p < p1; ++p) {
    float s[R][kPanel] = {};
    const int8_t* panel = w + p * K * kPanel;
    for (int64_t k = 0; k < K; ++k)
      for (int r = 0; r < R; ++r)
        for (int64_t c = 0; c < kPanel; ++c) s[r][c] += x[r * x_rs + k] * static_cast<float>(panel[k * kPanel + c]);
    const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
    for (int r = 0; r < R; ++r)
      for (int64_t c = 0; c < cols; ++c) acc[r * N + p * kPanel + c] = s[r][c];
  }
}

}  // namespace int8_gemm
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_X86_DISPATCH
#include "arch/x86/quantized_gemm_avx2.h"
#endif
#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/quantized_gemm_neon.h"
#endif

namespace etfuse {
namespace core {
namespace int8_gemm {

// ---- the table: each ISA's copies, chosen in one place --------------------------------------

template <class T>
using RequantRows = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const Requant&, T*);

using PanelsRows = void (*)(const float*, int64_t, int64_t, const int8_t*, int64_t, int64_t, float*, int64_t);

// The float path's kernels for 8-bit type T on one ISA (AVX-512 takes the AVX2 copies, NEON +
// dot product the NEON ones). panels_rows reads int8 weights whatever T is: take it from kernels<int8_t>.
template <class T>
struct Kernels {
  void (*integers)(const T*, int64_t, float, float*);
  RequantRows<T> requant_rows[2];  // [kPer]
  PanelsRows panels_rows[2];       // [rows - 1]
};

template <class T>
inline Kernels<T> kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2:
      return {&x86::integers_avx2<T>,
              {&x86::requant_rows_avx2<T, false>, &x86::requant_rows_avx2<T, true>},
              {&x86::panels_rows_avx2<1>, &x86::panels_rows_avx2<2>}};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon:
      return {&arm::integers_neon<T>,
              {&arm::requant_rows_neon<T, false>, &arm::requant_rows_neon<T, true>},
              {&arm::panels_rows_neon<1>, &arm::panels_rows_neon<2>}};
#endif
    default:
      return {&integers_base<T>,
              {&requant_rows_base<T, false>, &requant_rows_base<T, true>},
              {&panels_rows_base<1>, &panels_rows_base<2>}};
  }
}

// The selected ISA's copies.
template <class T>
inline void integers(const T* q, int64_t n, float zp, float* out) {
  kernels<T>(selected_isa()).integers(q, n, zp, out);
}

template <class T, bool kPer>
inline RequantRows<T> requant_rows() {
  return kernels<T>(selected_isa()).requant_rows[kPer];
}

// R: 1 or 2 rows.
template <int R>
inline PanelsRows panels_rows() {
  static_assert(R == 1 || R == 2, "panels_rows: 1 or 2 rows");
  return kernels<int8_t>(selected_isa()).panels_rows[R - 1];
}

}  // namespace int8_gemm
}  // namespace core
}  // namespace etfuse
