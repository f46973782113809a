// linear_qw (core/linear_qw.h) on aarch64 NEON: the weight converted to float in registers as it
// streams past, the same sums as the portable dot kernels (linear_qw_dot.h): within a group the
// sum of x * q runs unscaled, the group's scale multiplies it once, a zero point subtracts
// zp * scale * sum(x over the group). The dequantized rows (more rows) and the GEMM's packer
// (many rows) compute (q - zp) * scale as the pattern does.
//
// 4 bits: q - 8 in [-8, 7] is a half-precision number whose low byte is 0 (as on AVX2), so per 16
// nibbles one table lookup (tbl) gives the halves' high bytes, a widening shift left by 8 (shll)
// makes the halves and fcvtl the floats: 17 instructions per 32 weights where subtracting 8,
// sign-extending to int32 and converting (sub, sxtl, sxtl, scvtf) takes 25. fcvtl is base ARMv8
// (no FP16 extension), so Cortex-A53 runs it too.
// 8 bits: sxtl to 16 and to 32 bits, scvtf.
// The dot products on integers (sdot) would need the activation quantized: other numbers than
// x86's, so neon and neondot share these kernels.
#pragma once

#include <arm_neon.h>

#include <cstdint>

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

// sum over the chunk's 32 columns of x * q (q: 16 bytes at p): into s, or (First) as a new sum.
template <bool First>
ETFUSE_ALWAYS_INLINE float32x4_t chunk_dot(const float32x4_t (&xv)[8], const uint8_t* p, uint8x16_t table,
                                           float32x4_t s) {
  float32x4_t wv[8];
  q4(p, table, wv);
  s = First ? vmulq_f32(xv[0], wv[0]) : vfmaq_f32(s, xv[0], wv[0]);
  for (int t = 1; t < 8; ++t) s = vfmaq_f32(s, xv[t], wv[t]);
  return s;
}

ETFUSE_ALWAYS_INLINE void load_chunk_x(const float* x, float32x4_t (&xv)[8]) {
  for (int t = 0; t < 8; ++t) xv[t] = vld1q_f32(x + 4 * t);
}

// Row m of C, columns [j, j + nj) (nj <= 4; w[c] for c >= nj repeats a valid row of the weight),
// groups of G columns.
// `next`: the weight rows of the next block, prefetched a cache line per 64 bytes as this block
// streams its own (as the portable kernel does; null for all but a block's first row).
template <int Bits>
ETFUSE_ALWAYS_INLINE void dot_row(const Args& a, int64_t G, int64_t m, int64_t j, int64_t nj, const uint8_t* const* w,
                                  const uint8_t* const* next) {
  const float* x = a.A + m * a.a_rs;
  const uint8x16_t table = vld1q_u8(kHalfHigh);
  const float* sc[4];
  const uint8_t* wp[4];
  for (int c = 0; c < 4; ++c) {
    sc[c] = a.scales + (j + (c < nj ? c : 0)) * a.groups;
    wp[c] = w[c];
  }
  float32x4_t tot[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (Bits == 4 && G == kChunk) {
    // groups of one chunk (torchao's 32 columns): everything indexed by the group, tot += (x . q) * scale
    for (int64_t g = 0; g < a.groups; ++g) {
      const int64_t off = g * (kChunk / 2);
      if (next && (g & 3) == 0)
        for (int c = 0; c < 4; ++c) __builtin_prefetch(next[c] + off);
      float32x4_t xv[8];
      load_chunk_x(x + g * kChunk, xv);
      for (int c = 0; c < 4; ++c) tot[c] = vfmaq_n_f32(tot[c], chunk_dot<true>(xv, w[c] + off, table, tot[c]), sc[c][g]);
    }
  } else {
    for (int64_t g = 0; g < a.groups; ++g) {
      float32x4_t acc[4];
      if (Bits == 4) {  // G is a multiple of the chunk: the first chunk starts the sums
        if (next && (g * G & 127) == 0)
          for (int c = 0; c < 4; ++c) __builtin_prefetch(next[c] + g * G / 2);
        float32x4_t xv[8];
        load_chunk_x(x, xv);
        for (int c = 0; c < 4; ++c) acc[c] = chunk_dot<true>(xv, wp[c], table, acc[c]);
        for (int64_t k = kChunk; k < G; k += kChunk) {
          load_chunk_x(x + k, xv);
          for (int c = 0; c < 4; ++c) acc[c] = chunk_dot<false>(xv, wp[c] + k / 2, table, acc[c]);
        }
        for (int c = 0; c < 4; ++c) {
          tot[c] = vfmaq_n_f32(tot[c], acc[c], sc[c][g]);
          wp[c] += G / 2;
        }
      } else {
        for (int c = 0; c < 4; ++c) acc[c] = vdupq_n_f32(0.0f);
        float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t k = 0;
        for (; k + 16 <= G; k += 16) {
          if (next && ((g * G + k) & 63) == 0)
            for (int c = 0; c < 4; ++c) __builtin_prefetch(next[c] + g * G + k);
          float32x4_t xv[4];
          for (int t = 0; t < 4; ++t) xv[t] = vld1q_f32(x + k + 4 * t);
          for (int c = 0; c < 4; ++c) {
            float32x4_t wv[4];
            q8x16(wp[c] + k, wv);
            for (int t = 0; t < 4; ++t) acc[c] = vfmaq_f32(acc[c], xv[t], wv[t]);
          }
        }
        if (k + 8 <= G) {
          const float32x4_t x0 = vld1q_f32(x + k), x1 = vld1q_f32(x + k + 4);
          for (int c = 0; c < 4; ++c) {
            float32x4_t wv[2];
            q8x8(wp[c] + k, wv);
            acc[c] = vfmaq_f32(vfmaq_f32(acc[c], x0, wv[0]), x1, wv[1]);
          }
          k += 8;
        }
        for (; k < G; ++k)
          for (int c = 0; c < 4; ++c) rest[c] += x[k] * static_cast<float>(static_cast<int8_t>(wp[c][k]));
        for (int c = 0; c < 4; ++c) {
          const float s = sc[c][g];
          tot[c] = vfmaq_n_f32(tot[c], acc[c], s);
          tail[c] += rest[c] * s;
          wp[c] += G;
        }
      }
      x += G;
    }
  }
  if (a.zp) {  // zp * scale * sum(x over the group), per group
    const float* xsum = a.xsum + m * a.groups;
    for (int c = 0; c < 4; ++c) {
      const int8_t* zp = a.zp + (j + (c < nj ? c : 0)) * a.groups;
      for (int64_t gg = 0; gg < a.groups; ++gg) tail[c] -= static_cast<float>(zp[gg]) * sc[c][gg] * xsum[gg];
    }
  }
  float32x4_t sum = vaddq_f32(hsum4(tot), vld1q_f32(tail));
  if (nj == 4) {  // the same adds, a vector at a time
    if (a.bias) sum = vaddq_f32(sum, vld1q_f32(a.bias + j));
    if (a.residual) sum = vaddq_f32(sum, vld1q_f32(a.residual + m * a.r_rs + j));
    vst1q_f32(a.C + m * a.c_rs + j, sum);
    return;
  }
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
  const int64_t G = a.K / a.groups;
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    const uint8_t* w[4];
    const uint8_t* next[4];
    for (int c = 0; c < 4; ++c) {
      w[c] = a.W + (j + (c < nj ? c : 0)) * a.w_rs;
      next[c] = a.W + (j + 4 + c < j1 ? j + 4 + c : j) * a.w_rs;  // past the last block: this block again
    }
    for (int64_t m = 0; m < a.M; ++m) dot_row<Bits>(a, G, m, j, nj, w, m == 0 ? next : nullptr);
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

// gemm::Args::pack (many rows): pack[k * NR + j] = the dequantized weight (j0 + j, k0 + k), zero
// past nr. Four weight rows at a time dequantized into rows of a stack buffer, slice by slice of
// K, then transposed 4 x 4 into the panel (NR a multiple of 4).
template <int Bits>
ETFUSE_ALWAYS_INLINE void pack_panel(const Args& a, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR,
                                     float* pack) {
  constexpr int64_t kSlice = 256;
  alignas(16) float rows[4][kSlice];
  for (int64_t j = 0; j < NR; j += 4) {
    for (int64_t s = 0; s < kc; s += kSlice) {
      const int64_t len = kc - s < kSlice ? kc - s : kSlice;
      for (int c = 0; c < 4; ++c) {
        if (j + c < nr) {
          dequantize_row<Bits>(a, j0 + j + c, k0 + s, len, rows[c]);
        } else {
          for (int64_t k = 0; k < len; ++k) rows[c][k] = 0.0f;
        }
      }
      float* dst = pack + s * NR + j;
      int64_t k = 0;
      for (; k + 4 <= len; k += 4, dst += 4 * NR) {
        const float32x4_t r0 = vld1q_f32(rows[0] + k), r1 = vld1q_f32(rows[1] + k);
        const float32x4_t r2 = vld1q_f32(rows[2] + k), r3 = vld1q_f32(rows[3] + k);
        const float64x2_t t01 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), u01 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
        const float64x2_t t23 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), u23 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
        vst1q_f32(dst, vreinterpretq_f32_f64(vzip1q_f64(t01, t23)));
        vst1q_f32(dst + NR, vreinterpretq_f32_f64(vzip1q_f64(u01, u23)));
        vst1q_f32(dst + 2 * NR, vreinterpretq_f32_f64(vzip2q_f64(t01, t23)));
        vst1q_f32(dst + 3 * NR, vreinterpretq_f32_f64(vzip2q_f64(u01, u23)));
      }
      for (; k < len; ++k, dst += NR)
        for (int c = 0; c < 4; ++c) dst[c] = rows[c][k];
    }
  }
}

}  // namespace arm
}  // namespace linear_qw
}  // namespace core
}  // namespace etfuse
