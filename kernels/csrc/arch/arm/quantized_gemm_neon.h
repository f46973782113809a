// The NEON copies of the int8 ops' float-path loops (core/int8_gemm.h picks them): 8-bit values
// to float integers, the requantizing epilogue (arch/arm/requant_neon.h, without contraction)
// and the GEMV on int8 panels, which runs in integers: its x rows are integers in [-255, 255]
// (q - zp), so int16 x by lane times the int16 weight into int32 (smlal) is the exact sum the
// float copies compute (theirs exact below 2^24).
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "arch/arm/requant_neon.h"
#include "core/int8_gemm.h"

namespace etfuse {
namespace core {
namespace int8_gemm {
namespace arm {

template <class T>
void integers_neon(const T* q, int64_t n, float zp, float* out) {
  const float32x4_t z = vdupq_n_f32(zp);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int16x8_t v = std::is_same<T, int8_t>::value
                            ? vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(q + i)))
                            : vreinterpretq_s16_u16(vmovl_u8(vld1_u8(reinterpret_cast<const uint8_t*>(q + i))));
    vst1q_f32(out + i, vsubq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), z));
    vst1q_f32(out + i + 4, vsubq_f32(vcvtq_f32_s32(vmovl_high_s16(v)), z));
  }
  integers_base(q + i, n - i, zp, out + i);
}

// requant_loop over n values, 8 a vector.
template <class T, bool kPer>
ETFUSE_ALWAYS_INLINE void requant_neon(const float* acc, int64_t n, int64_t c, const Requant& r, T* q) {
  const core::arm::RequantNeon e = core::arm::requant_neon(r);
  const float32x4_t s1 = vdupq_n_f32(r.scale[c]), b1 = vdupq_n_f32(r.bias ? r.bias[c] : 0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float32x4_t y0 = vmulq_f32(vld1q_f32(acc + i), kPer ? vld1q_f32(r.scale + i) : s1);
    float32x4_t y1 = vmulq_f32(vld1q_f32(acc + i + 4), kPer ? vld1q_f32(r.scale + i + 4) : s1);
    if (r.bias) {
      y0 = vaddq_f32(y0, kPer ? vld1q_f32(r.bias + i) : b1);
      y1 = vaddq_f32(y1, kPer ? vld1q_f32(r.bias + i + 4) : b1);
    }
    vst1_u8(reinterpret_cast<uint8_t*>(q + i), core::arm::requant8(e, y0, y1));
  }
  requant_tail<T, kPer>(acc, i, n, c, r, q);
}

template <class T, bool kPer>
ETFUSE_NO_FP_CONTRACT void requant_rows_neon(const float* acc, int64_t rows, int64_t inner, int64_t row0,
                                             int64_t channels, const Requant& r, T* q) {
  for (int64_t i = 0; i < rows; ++i) {
    requant_neon<T, kPer>(acc + i * inner, inner, kPer ? 0 : (row0 + i) % channels, r, q + i * inner);
  }
}

// The 16 sums of a panel row k += x[k] * w[k][0..16), x[k] lane L of xv.
#define ETFUSE_PANEL_MLAL(L)                                     \
  do {                                                           \
    const int8x16_t v = vld1q_s8(panel + (k + L) * kPanel);      \
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v); \
    for (int r = 0; r < R; ++r) {                                \
      s[r][0] = vmlal_laneq_s16(s[r][0], vget_low_s16(lo), xv[r], L); \
      s[r][1] = vmlal_high_laneq_s16(s[r][1], lo, xv[r], L);     \
      s[r][2] = vmlal_laneq_s16(s[r][2], vget_low_s16(hi), xv[r], L); \
      s[r][3] = vmlal_high_laneq_s16(s[r][3], hi, xv[r], L);     \
    }                                                            \
  } while (0)

// acc[R, N] = x[R, K] (rows x_rs apart, integers) @ int8 panels [p0, p1) ([N16 / 16][K][16]).
template <int R>
void panels_rows_neon(const float* x, int64_t x_rs, int64_t K, const int8_t* w, int64_t p0, int64_t p1, float* acc,
                      int64_t N) {
  const int64_t K8 = (K + 7) / 8 * 8;
  thread_local std::vector<int16_t> xi;  // the rows as int16, zero to K8
  xi.assign(static_cast<size_t>(R * K8), 0);
  for (int r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) xi[r * K8 + k] = static_cast<int16_t>(x[r * x_rs + k]);
  for (int64_t p = p0; p < p1; ++p) {
    int32x4_t s[R][4];
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = vdupq_n_s32(0);
    const int8_t* panel = w + p * K * kPanel;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      int16x8_t xv[R];
      for (int r = 0; r < R; ++r) xv[r] = vld1q_s16(xi.data() + r * K8 + k);
      ETFUSE_PANEL_MLAL(0);
      ETFUSE_PANEL_MLAL(1);
      ETFUSE_PANEL_MLAL(2);
      ETFUSE_PANEL_MLAL(3);
      ETFUSE_PANEL_MLAL(4);
      ETFUSE_PANEL_MLAL(5);
      ETFUSE_PANEL_MLAL(6);
      ETFUSE_PANEL_MLAL(7);
    }
    for (; k < K; ++k) {  // the last K % 8 rows of the panel, x by value
      const int8x16_t v = vld1q_s8(panel + k * kPanel);
      const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
      for (int r = 0; r < R; ++r) {
        const int16_t xk = xi[r * K8 + k];
        s[r][0] = vmlal_n_s16(s[r][0], vget_low_s16(lo), xk);
        s[r][1] = vmlal_high_n_s16(s[r][1], lo, xk);
        s[r][2] = vmlal_n_s16(s[r][2], vget_low_s16(hi), xk);
        s[r][3] = vmlal_high_n_s16(s[r][3], hi, xk);
      }
    }
    const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
    for (int r = 0; r < R; ++r) {
      float t[kPanel];
      for (int j = 0; j < 4; ++j) vst1q_f32(t + 4 * j, vcvtq_f32_s32(s[r][j]));
      for (int64_t c = 0; c < cols; ++c) acc[r * N + p * kPanel + c] = t[c];
    }
  }
}
#undef ETFUSE_PANEL_MLAL

}  // namespace arm
}  // namespace int8_gemm
}  // namespace core
}  // namespace etfuse
