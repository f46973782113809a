// The AVX2 copies of quantized.h's add / add_relu / add.scalar inner loop and of per-tensor
// quantize / dequantize (core/quantized.h picks them). Compiled for AVX2 *without* FMA
// (ETFUSE_TARGET_AVX2_NOFMA): each step the same float32 operation as the portable loops.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "core/quantized.h"

namespace etfuse {
namespace core {
namespace quantized {
namespace x86 {

template <class T>
ETFUSE_TARGET_AVX2_NOFMA ETFUSE_ALWAYS_INLINE __m256i widen8(__m128i v) {
  return std::is_signed<T>::value ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// 16 contiguous quantized elements of `a` (and of `b`, or a broadcast float y) -> 16 outputs.
// Each step is the same float32 operation as the scalar loop (no FMA: target avx2 only).
template <class T, bool kRelu, bool kBcastB>
ETFUSE_TARGET_AVX2_NOFMA int64_t binary_vec16(
    int64_t len, const T* a, const T* b, float yb, T* o, const QParams& qa, const QParams& qb, const QParams& qo) {
  const __m256 sa = _mm256_set1_ps(qa.scale), za = _mm256_set1_ps(qa.zero_point);
  const __m256 sb = _mm256_set1_ps(qb.scale), zb = _mm256_set1_ps(qb.zero_point);
  const __m256 inv = _mm256_set1_ps(qo.inv_scale), zo = _mm256_set1_ps(qo.zero_point);
  const __m256 lo = _mm256_set1_ps(qo.qmin), hi = _mm256_set1_ps(qo.qmax), zero = _mm256_setzero_ps();
  const __m256 yv = _mm256_set1_ps(yb);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    __m256 r[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i ai = widen8<T>(h ? _mm_srli_si128(va, 8) : va);
      const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(ai), za), sa);
      __m256 y = yv;
      if (!kBcastB) {
        const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
        const __m256i bi = widen8<T>(h ? _mm_srli_si128(vb, 8) : vb);
        y = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(bi), zb), sb);
      }
      __m256 sum = _mm256_add_ps(x, y);
      if (kRelu) sum = _mm256_max_ps(sum, zero);  // finite inputs: same as s < 0 ? 0 : s
      __m256 q = _mm256_round_ps(_mm256_mul_ps(sum, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_add_ps(q, zo);
      r[h] = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
    }
    __m256i p16 = _mm256_packs_epi32(_mm256_cvtps_epi32(r[0]), _mm256_cvtps_epi32(r[1]));
    p16 = _mm256_permute4x64_epi64(p16, 0xD8);
    const __m128i l = _mm256_castsi256_si128(p16), u = _mm256_extracti128_si256(p16, 1);
    const __m128i p8 = std::is_signed<T>::value ? _mm_packs_epi16(l, u) : _mm_packus_epi16(l, u);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), p8);
  }
  return i;
}

template <class TA, class TB, class TO, bool kRelu>
ETFUSE_TARGET_AVX2_NOFMA void binary_inner_avx2(
    int64_t len, const TA* a, int64_t ia, const TB* b, int64_t ib, TO* o, int64_t io, const QParams& qa,
    const QParams& qb, const QParams& qo) {
  if (std::is_same<TA, TO>::value && sizeof(TA) == 1 && io == 1) {
    using T = TA;
    const T* at = reinterpret_cast<const T*>(a);
    T* ot = reinterpret_cast<T*>(o);
    int64_t done = 0;
    if (std::is_same<TB, TA>::value && ia == 1 && ib == 1) {
      done = binary_vec16<T, kRelu, false>(len, at, reinterpret_cast<const T*>(b), 0.0f, ot, qa, qb, qo);
    } else if (ia == 1 && ib == 0) {
      const float y = (static_cast<float>(*b) - qb.zero_point) * qb.scale;
      done = binary_vec16<T, kRelu, true>(len, at, nullptr, y, ot, qa, qb, qo);
    } else if (std::is_same<TB, TA>::value && ia == 0 && ib == 1) {
      // x + y == y + x exactly: run with the operands swapped.
      const float x = (static_cast<float>(*a) - qa.zero_point) * qa.scale;
      done = binary_vec16<T, kRelu, true>(len, reinterpret_cast<const T*>(b), nullptr, x, ot, qb, qa, qo);
    }
    if (done) {
      BinaryLoop<TA, TB, TO, kRelu>::body(len - done, a + (ia ? done : 0), ia, b + (ib ? done : 0), ib, o + done, io,
                                          qa, qb, qo);
      return;
    }
  }
  BinaryLoop<TA, TB, TO, kRelu>::body(len, a, ia, b, ib, o, io, qa, qb, qo);
}

template <class TQ>
ETFUSE_TARGET_AVX2_NOFMA void quantize_avx2(int64_t n, const float* x, TQ* q, const QParams& p) {
  QdqLoop<TQ>::quantize(n, x, q, p);
}
template <class TQ>
ETFUSE_TARGET_AVX2_NOFMA void dequantize_avx2(int64_t n, const TQ* q, float* x, const QParams& p) {
  QdqLoop<TQ>::dequantize(n, q, x, p);
}

}  // namespace x86
}  // namespace quantized
}  // namespace core
}  // namespace etfuse
