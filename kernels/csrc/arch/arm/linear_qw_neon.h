// linear_qw (core/linear_qw.h) on aarch64 NEON: the weight converted to float in registers as it
// streams past, the same sums in the same places as the portable dot kernels (linear_qw_dot.h):
// within a group the sum of x * q runs unscaled, the group's scale multiplies it once, a zero
// point subtracts zp * scale * sum(x over the group).
//
// 4 bits: q - 8 in [-8, 7] is a half-precision number whose low byte is 0 (as on AVX2), so per 16
// nibbles one table lookup (tbl) gives the halves' high bytes, a widening shift left by 8 (shll)
// makes the halves and fcvtl the floats: 17 instructions per 32 weights where sign-extending to
// int32 and converting (sxtl, sxtl, scvtf) takes 23. fcvtl is base ARMv8 (no FP16 extension), so
// Cortex-A53 runs it too.
// 8 bits: sxtl to 16 and to 32 bits, scvtf.
// The dot products on integers (sdot) would need the activation quantized: other numbers than
// x86's, so neon and neondot share these kernels.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <vector>

#include "core/common.h"

namespace etfuse {
namespace core {
namespace linear_qw {
namespace arm {

// The 16 halves q - 8 (q = 0..15) as their high bytes (the low bytes are 0).
alignas(16) constexpr uint8_t kHalfHigh[16] = {0xC8, 0xC7, 0xC6, 0xC5, 0xC4, 0xC2, 0xC0, 0xBC,
                                               0x00, 0x3C, 0x40, 0x42, 0x44, 0x45, 0x46, 0x47};

ETFUSE_ALWAYS_INLINE void halves_to_floats(uint8x16_t high, float32x4_t* out) {
  const float16x8_t h0 = vreinterpretq_f16_u16(vshll_n_u8(vget_low_u8(high), 8));
  const float16x8_t h1 = vreinterpretq_f16_u16(vshll_high_n_u8(high, 8));
  out[0] = vcvt_f32_f16(vget_low_f16(h0));
  out[1] = vcvt_high_f32_f16(h0);
  out[2] = vcvt_f32_f16(vget_low_f16(h1));
  out[3] = vcvt_high_f32_f16(h1);
}

// One 32-column chunk of 4-bit weights (16 bytes at p) -> 8 vectors, in column order (low
// nibbles are columns 0..15, high nibbles 16..31). `table`: kHalfHigh, loaded once by the caller.
ETFUSE_ALWAYS_INLINE void q4(const uint8_t* p, uint8x16_t table, float32x4_t (&out)[8]) {
  const uint8x16_t b = vld1q_u8(p);
  halves_to_floats(vqtbl1q_u8(table, vandq_u8(b, vdupq_n_u8(15))), out);
  halves_to_floats(vqtbl1q_u8(table, vshrq_n_u8(b, 4)), out + 4);
}

ETFUSE_ALWAYS_INLINE void s16_to_floats(int16x8_t v, float32x4_t* out) {
  out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
  out[1] = vcvtq_f32_s32(vmovl_high_s16(v));
}

// 16 int8 weights at p -> 4 vectors.
ETFUSE_ALWAYS_INLINE void q8x16(const uint8_t* p, float32x4_t (&out)[4]) {
  const int8x16_t b = vreinterpretq_s8_u8(vld1q_u8(p));
  s16_to_floats(vmovl_s8(vget_low_s8(b)), out);
  s16_to_floats(vmovl_high_s8(b), out + 2);
}

// 8 int8 weights at p -> 2 vectors.
ETFUSE_ALWAYS_INLINE void q8x8(const uint8_t* p, float32x4_t (&out)[2]) {
  s16_to_floats(vmovl_s8(vreinterpret_s8_u8(vld1_u8(p))), out);
}

// The four sums of t[0..3]'s lanes, as one vector.
ETFUSE_ALWAYS_INLINE float32x4_t hsum4(const float32x4_t (&t)[4]) {
  return vpaddq_f32(vpaddq_f32(t[0], t[1]), vpaddq_f32(t[2], t[3]));
}

// Row m of C, columns [j, j + nj) (nj <= 4; w[c] for c >= nj repeats a valid row of the weight).
// `next`: the weight rows of the next block, prefetched a cache line per 64 bytes as this block
// streams its own (as the portable kernel does; null for all but a block's first row).
template <int Bits>
ETFUSE_ALWAYS_INLINE void dot_row(const Args& a, int64_t m, int64_t j, int64_t nj, const uint8_t* const* w,
                                  const uint8_t* const* next) {
  const float* x = a.A + m * a.a_rs;
  const int64_t G = a.K / a.groups;
  const uint8x16_t table = vld1q_u8(kHalfHigh);
  const float* sc[4];
  const int8_t* zp[4];
  for (int c = 0; c < 4; ++c) {
    const int64_t n = j + (c < nj ? c : 0);
    sc[c] = a.scales + n * a.groups;
    zp[c] = a.zp ? a.zp + n * a.groups : nullptr;
  }
  float32x4_t tot[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float* xsum = a.zp ? a.xsum + m * a.groups : nullptr;
  for (int64_t g = 0, k0 = 0; g < a.groups; ++g, k0 += G) {
    const int64_t k1 = k0 + G;
    float32x4_t acc[4];
    float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (Bits == 4) {  // G is a multiple of the chunk: the first chunk starts the sums
      const auto chunk = [&](int64_t k, bool first) {
        if (next && (k & 127) == 0)
          for (int c = 0; c < 4; ++c) __builtin_prefetch(next[c] + k / 2);
        float32x4_t xv[8];
        for (int t = 0; t < 8; ++t) xv[t] = vld1q_f32(x + k + 4 * t);
        for (int c = 0; c < 4; ++c) {
          float32x4_t wv[8];
          q4(w[c] + k / 2, table, wv);
          float32x4_t s = first ? vmulq_f32(xv[0], wv[0]) : vfmaq_f32(acc[c], xv[0], wv[0]);
          for (int t = 1; t < 8; ++t) s = vfmaq_f32(s, xv[t], wv[t]);
          acc[c] = s;
        }
      };
      chunk(k0, true);
      for (int64_t k = k0 + kChunk; k < k1; k += kChunk) chunk(k, false);
    } else {
      for (int c = 0; c < 4; ++c) acc[c] = vdupq_n_f32(0.0f);
      int64_t k = k0;
      for (; k + 16 <= k1; k += 16) {
        if (next && (k & 63) == 0)
          for (int c = 0; c < 4; ++c) __builtin_prefetch(next[c] + k);
        float32x4_t xv[4];
        for (int t = 0; t < 4; ++t) xv[t] = vld1q_f32(x + k + 4 * t);
        for (int c = 0; c < 4; ++c) {
          float32x4_t wv[4];
          q8x16(w[c] + k, wv);
          for (int t = 0; t < 4; ++t) acc[c] = vfmaq_f32(acc[c], xv[t], wv[t]);
        }
      }
      if (k + 8 <= k1) {
        const float32x4_t x0 = vld1q_f32(x + k), x1 = vld1q_f32(x + k + 4);
        for (int c = 0; c < 4; ++c) {
          float32x4_t wv[2];
          q8x8(w[c] + k, wv);
          acc[c] = vfmaq_f32(vfmaq_f32(acc[c], x0, wv[0]), x1, wv[1]);
        }
        k += 8;
      }
      for (; k < k1; ++k)
        for (int c = 0; c < 4; ++c) rest[c] += x[k] * static_cast<float>(static_cast<int8_t>(w[c][k]));
    }
    for (int c = 0; c < 4; ++c) {
      const float s = sc[c][g];
      tot[c] = vfmaq_n_f32(tot[c], acc[c], s);
      if (Bits == 8) tail[c] += rest[c] * s;
      if (xsum) tail[c] -= static_cast<float>(zp[c][g]) * s * xsum[g];
    }
  }
  float32x4_t sum = vaddq_f32(hsum4(tot), vld1q_f32(tail));
  float out[4];
  vst1q_f32(out, sum);
  for (int c = 0; c < nj; ++c) {
    float v = out[c];
    if (a.bias) v += a.bias[j + c];
    if (a.residual) v += a.residual[m * a.r_rs + j + c];
    a.C[m * a.c_rs + j + c] = v;
  }
}

// Few rows (decode): blocks of 4 weight rows, every row of A over each block while it is in L1.
template <int Bits>
ETFUSE_ALWAYS_INLINE void dot_cols(const Args& a, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    const uint8_t* w[4];
    const uint8_t* next[4];
    for (int c = 0; c < 4; ++c) {
      w[c] = a.W + (j + (c < nj ? c : 0)) * a.w_rs;
      next[c] = a.W + (j + 4 + c < j1 ? j + 4 + c : j) * a.w_rs;  // past the last block: this block again
    }
    for (int64_t m = 0; m < a.M; ++m) dot_row<Bits>(a, m, j, nj, w, m == 0 ? next : nullptr);
  }
}

// Weight row n, columns [k0, k0 + kc) dequantized, (q - zp) * scale as the pattern computes it,
// into dst[0 .. kc). k0 and kc on group or chunk boundaries or not (a GEMM panel's K slice): the
// group advances by a counter, no division in the loop.
template <int Bits>
ETFUSE_ALWAYS_INLINE void dequantize_row(const Args& a, int64_t n, int64_t k0, int64_t kc, float* dst) {
  const int64_t G = a.K / a.groups;
  const uint8_t* w = a.W + n * a.w_rs;
  const float* sc = a.scales + n * a.groups;
  const int8_t* zp = a.zp ? a.zp + n * a.groups : nullptr;
  const uint8x16_t table = vld1q_u8(kHalfHigh);
  int64_t g = k0 / G, k = k0;
  const int64_t end = k0 + kc;
  for (int64_t gk1 = (g + 1) * G; k < end; ++g, gk1 += G) {
    const int64_t k1 = gk1 < end ? gk1 : end;
    const float s = sc[g];
    const float z = zp ? static_cast<float>(zp[g]) : 0.0f;
    const float32x4_t sv = vdupq_n_f32(s), zv = vdupq_n_f32(z);
    if (Bits == 4) {
      // whole chunks from k's chunk on (the panel's first and last may start or end inside one)
      for (; k < k1;) {
        const int64_t c0 = k & ~(kChunk - 1), c1 = c0 + kChunk < k1 ? c0 + kChunk : k1;
        float32x4_t wv[8];
        q4(w + c0 / 2, table, wv);
        if (k == c0 && c1 == c0 + kChunk) {
          for (int t = 0; t < 8; ++t) vst1q_f32(dst + (k - k0) + 4 * t, vmulq_f32(vsubq_f32(wv[t], zv), sv));
        } else {
          float tmp[kChunk];
          for (int t = 0; t < 8; ++t) vst1q_f32(tmp + 4 * t, vmulq_f32(vsubq_f32(wv[t], zv), sv));
          for (int64_t i = k; i < c1; ++i) dst[i - k0] = tmp[i - c0];
        }
        k = c1;
      }
    } else {
      for (; k + 16 <= k1; k += 16) {
        float32x4_t wv[4];
        q8x16(w + k, wv);
        for (int t = 0; t < 4; ++t) vst1q_f32(dst + (k - k0) + 4 * t, vmulq_f32(vsubq_f32(wv[t], zv), sv));
      }
      for (; k < k1; ++k) dst[k - k0] = (static_cast<float>(static_cast<int8_t>(w[k])) - z) * s;
    }
  }
}

}  // namespace arm
}  // namespace linear_qw
}  // namespace core
}  // namespace etfuse
