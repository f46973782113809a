// The AVX2 copies of the int8 ops' float-path loops (core/int8_gemm.h picks them): 8-bit values
// to float integers, the requantizing epilogue (without FMA: each step its own float32
// operation, as requant_loop) and the GEMV on int8 panels.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/int8_gemm.h"
#include "core/quantized.h"

namespace etfuse {
namespace core {
namespace int8_gemm {
namespace x86 {

template <class T>
ETFUSE_TARGET_AVX2_NOFMA void integers_avx2(const T* q, int64_t n, float zp, float* out) {
  const __m256 z = _mm256_set1_ps(zp);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256i w = std::is_same<T, int8_t>::value ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
    _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_cvtepi32_ps(w), z));
  }
  integers_base(q + i, n - i, zp, out + i);
}

// 8 values: mul, add, mul, round half to even, add, clamp, each its own float32 operation (no
// FMA: this target has none), as requant_loop.
template <class T, bool kPer>
ETFUSE_TARGET_AVX2_NOFMA ETFUSE_ALWAYS_INLINE void requant_avx2(const float* acc, int64_t n, int64_t c,
                                                               const Requant& r, T* q) {
  const __m256 inv = _mm256_set1_ps(r.inv), zp = _mm256_set1_ps(r.zp), lo = _mm256_set1_ps(r.lo),
               hi = _mm256_set1_ps(r.hi);
  const __m256 s1 = _mm256_set1_ps(r.scale[c]), b1 = _mm256_set1_ps(r.bias ? r.bias[c] : 0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sc = kPer ? _mm256_loadu_ps(r.scale + i) : s1;
    __m256 y = _mm256_mul_ps(_mm256_loadu_ps(acc + i), sc);
    if (r.bias) y = _mm256_add_ps(y, kPer ? _mm256_loadu_ps(r.bias + i) : b1);
    y = _mm256_add_ps(_mm256_round_ps(_mm256_mul_ps(y, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
    y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
    const __m256i v = _mm256_cvtps_epi32(y);  // integral and in range: exact
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b = std::is_same<T, int8_t>::value ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), b);
  }
  requant_tail<T, kPer>(acc, i, n, c, r, q);
}

template <class T, bool kPer>
ETFUSE_TARGET_AVX2_NOFMA void requant_rows_avx2(const float* acc, int64_t rows, int64_t inner, int64_t row0,
                                                int64_t channels, const Requant& r, T* q) {
  for (int64_t i = 0; i < rows; ++i) {
    requant_avx2<T, kPer>(acc + i * inner, inner, kPer ? 0 : (row0 + i) % channels, r, q + i * inner);
  }
}

// Each panel's K x 16 values converted in registers and multiplied into all R rows' 16 sums
// (exact: integer products and sums below 2^24, so the FMA changes nothing).
template <int R>
ETFUSE_TARGET_AVX2 void panels_rows_avx2(const float* x, int64_t x_rs, int64_t K, const int8_t* w, int64_t p0,
                                         int64_t p1, float* acc, int64_t N) {
  for (int64_t p = p0; p < p1; ++p) {
    __m256 s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
    const int8_t* panel = w + p * K * kPanel;
    for (int64_t k = 0; k < K; ++k) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k * kPanel));
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * x_rs + k);
        s0[r] = _mm256_fmadd_ps(xv, lo, s0[r]);
        s1[r] = _mm256_fmadd_ps(xv, hi, s1[r]);
      }
    }
    const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
    for (int r = 0; r < R; ++r) {
      alignas(32) float t[kPanel];
      _mm256_store_ps(t, s0[r]);
      _mm256_store_ps(t + 8, s1[r]);
      for (int64_t c = 0; c < cols; ++c) acc[r * N + p * kPanel + c] = t[c];
    }
  }
}

}  // namespace x86
}  // namespace int8_gemm
}  // namespace core
}  // namespace etfuse
