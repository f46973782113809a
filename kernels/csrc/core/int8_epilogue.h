// The requantizing epilogue of the int8 conv kernels on AVX-512 (int8_pointwise.h,
// int8_depthwise.h), and the conv shape both take: 16 exact integer sums of one output channel -> 16 int8 / uint8 values,
//   out = clamp(rint((acc * scale[c] + bias[c]) * inv) + zp, lo, hi)
// one float32 operation at a time, as the float path's requant_loop (ops/quantized_gemm.h), so
// the kernels are bit-exact with it. The `_round` intrinsics (current rounding mode) are never
// contracted into an FMA, which plain `*` and `+` on vectors may be.
#pragma once

#include <cstdint>
#include <cstring>

#include "common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#define ETFUSE_TARGET_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif

namespace etfuse {
namespace core {
namespace int8_epilogue {

// The shape of an int8 conv as its kernels read it (one image: N; C input channels on H x W,
// KH x KW taps, OH x OW outputs).
struct Geometry {
  int64_t N = 0, C = 0, H = 0, W = 0, KH = 1, KW = 1, OH = 0, OW = 0;
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
};

// A spatial conv (groups 1) as a 1x1 conv over its im2col: row k = (c, kh, kw) of [K][OH * OW]
// bytes holds the input pixel each output reads at that tap, the padding as `pad` (the input's
// zero point byte). `padded` holds C x (H + 2 pad) x (W + 2 pad) + 64 bytes. Rows at a stride
// above 1 go through `strided(dst, src, OW, stride)`, each ISA's copy (it may read the bytes
// between the last output's and the row's end: inside the padded row and the spare bytes).
template <class Strided>
inline void im2col(const Geometry& g, const uint8_t* x, uint8_t pad, uint8_t* padded, uint8_t* col,
                   Strided&& strided) {
  const int64_t Hp = g.H + 2 * g.padding[0], Wp = g.W + 2 * g.padding[1], P = g.OH * g.OW;
  std::memset(padded, pad, static_cast<size_t>(g.C * Hp * Wp));
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t y = 0; y < g.H; ++y)
      std::memcpy(padded + (c * Hp + y + g.padding[0]) * Wp + g.padding[1], x + (c * g.H + y) * g.W, static_cast<size_t>(g.W));
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        uint8_t* dst = col + ((c * g.KH + kh) * g.KW + kw) * P;
        for (int64_t oh = 0; oh < g.OH; ++oh, dst += g.OW) {
          const uint8_t* src = padded + (c * Hp + oh * g.stride[0] + kh * g.dilation[0]) * Wp + kw * g.dilation[1];
          if (g.stride[1] == 1) {
            std::memcpy(dst, src, static_cast<size_t>(g.OW));
          } else {
            strided(dst, src, g.OW, g.stride[1]);
          }
        }
      }
}

// The portable strided row of im2col.
inline void strided_bytes(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
}

struct Requant {
  const float* scale = nullptr;  // [C]: float(input_scale) * weight_scale[c]
  const float* bias = nullptr;   // [C], null: none
  float inv = 1.0f, zp = 0.0f, lo = 0.0f, hi = 0.0f;
};

#if defined(ETFUSE_CORE_KERNELS) && ETFUSE_HAVE_X86_DISPATCH
// 16 sums (exact integers in float32) with their scales and biases (`has_bias` false: none)
// -> 16 bytes.
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE __m128i requant16(const Requant& r, __m512 acc, __m512 scale,
                                                              bool has_bias, __m512 bias) {
  constexpr int kCur = _MM_FROUND_CUR_DIRECTION;
  __m512 y = _mm512_mul_round_ps(acc, scale, kCur);
  if (has_bias) y = _mm512_add_round_ps(y, bias, kCur);
  y = _mm512_roundscale_ps(_mm512_mul_round_ps(y, _mm512_set1_ps(r.inv), kCur),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  y = _mm512_add_round_ps(y, _mm512_set1_ps(r.zp), kCur);
  y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(r.lo)), _mm512_set1_ps(r.hi));
  // integral and inside [-128, 255]: the conversion is exact, the truncating narrow keeps the
  // low byte (int8 or uint8 alike)
  return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(y));
}

// `acc`: 16 sums of channel c; the lanes of `mask` are stored at dst.
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE void store16(const Requant& r, __m512 acc, int64_t c, __mmask16 mask,
                                                         uint8_t* dst) {
  const __m512 bias = r.bias ? _mm512_set1_ps(r.bias[c]) : _mm512_setzero_ps();
  _mm_mask_storeu_epi8(dst, mask, requant16(r, acc, _mm512_set1_ps(r.scale[c]), r.bias != nullptr, bias));
}

// The 16 x 16 bytes v[i][j] -> v[j][i] (SSE2 unpacks, four rounds).
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE void transpose16(__m128i (&v)[16]) {
  __m128i b[16], c[16], d[16];
  for (int k = 0; k < 8; ++k) {  // 16-bit units: column p of rows 2k, 2k + 1
    b[2 * k] = _mm_unpacklo_epi8(v[2 * k], v[2 * k + 1]);
    b[2 * k + 1] = _mm_unpackhi_epi8(v[2 * k], v[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // 32-bit units: rows 4k .. 4k + 3, columns in fours
    c[4 * k] = _mm_unpacklo_epi16(b[4 * k], b[4 * k + 2]);
    c[4 * k + 1] = _mm_unpackhi_epi16(b[4 * k], b[4 * k + 2]);
    c[4 * k + 2] = _mm_unpacklo_epi16(b[4 * k + 1], b[4 * k + 3]);
    c[4 * k + 3] = _mm_unpackhi_epi16(b[4 * k + 1], b[4 * k + 3]);
  }
  for (int k = 0; k < 2; ++k) {  // 64-bit units: rows 8k .. 8k + 7, columns in twos
    for (int q = 0; q < 4; ++q) {
      d[8 * k + 2 * q] = _mm_unpacklo_epi32(c[8 * k + q], c[8 * k + 4 + q]);
      d[8 * k + 2 * q + 1] = _mm_unpackhi_epi32(c[8 * k + q], c[8 * k + 4 + q]);
    }
  }
  for (int m = 0; m < 8; ++m) {
    v[2 * m] = _mm_unpacklo_epi64(d[m], d[8 + m]);
    v[2 * m + 1] = _mm_unpackhi_epi64(d[m], d[8 + m]);
  }
}
#endif

}  // namespace int8_epilogue
}  // namespace core
}  // namespace etfuse
