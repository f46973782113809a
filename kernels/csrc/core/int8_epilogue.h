// The requantizing epilogue of the int8 conv kernels on AVX-512 (int8_pointwise.h,
// int8_depthwise.h), and the conv shape both take: 16 exact integer sums of one output channel -> 16 int8 / uint8 values,
//   out = clamp(rint((acc * scale[c] + bias[c]) * inv) + zp, lo, hi)
// one float32 operation at a time, as the float path's requant_loop (ops/quantized_gemm.h), so
// the kernels are bit-exact with it. The `_round` intrinsics (current rounding mode) are never
// contracted into an FMA, which plain `*` and `+` on vectors may be.
#pragma once

#include <cstdint>

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
