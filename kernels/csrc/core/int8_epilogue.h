// The requantizing epilogue of the int8 conv kernels on AVX-512 (int8_pointwise.h,
// int8_depthwise.h): 16 exact integer sums of one output channel -> 16 int8 / uint8 values,
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
#else
#define ETFUSE_TARGET_AVX512BW
#endif

namespace etfuse {
namespace core {
namespace int8_epilogue {

struct Requant {
  const float* scale = nullptr;  // [C]: float(input_scale) * weight_scale[c]
  const float* bias = nullptr;   // [C], null: none
  float inv = 1.0f, zp = 0.0f, lo = 0.0f, hi = 0.0f;
};

inline bool cpu_has_avx512bw() {
#if ETFUSE_HAVE_X86_DISPATCH
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

#if defined(ETFUSE_CORE_KERNELS) && ETFUSE_HAVE_X86_DISPATCH
// `acc`: channel c's sums (exact integers in float32); the lanes of `mask` are stored at dst.
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE void store16(const Requant& r, __m512 acc, int64_t c, __mmask16 mask,
                                                         uint8_t* dst) {
  constexpr int kCur = _MM_FROUND_CUR_DIRECTION;
  __m512 y = _mm512_mul_round_ps(acc, _mm512_set1_ps(r.scale[c]), kCur);
  if (r.bias) y = _mm512_add_round_ps(y, _mm512_set1_ps(r.bias[c]), kCur);
  y = _mm512_roundscale_ps(_mm512_mul_round_ps(y, _mm512_set1_ps(r.inv), kCur),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  y = _mm512_add_round_ps(y, _mm512_set1_ps(r.zp), kCur);
  y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(r.lo)), _mm512_set1_ps(r.hi));
  // integral and inside [-128, 255]: the conversion is exact, the truncating narrow keeps the
  // low byte (int8 or uint8 alike)
  _mm_mask_storeu_epi8(dst, mask, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(y)));
}
#endif

}  // namespace int8_epilogue
}  // namespace core
}  // namespace etfuse
