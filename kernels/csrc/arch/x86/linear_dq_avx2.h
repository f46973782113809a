// linear_dq's primitives on AVX2 (core/linear_dq.h includes this inside namespace linear_dq, under
// `#pragma GCC target("avx2,fma,f16c")`): the same results as core/linear_dq_portable.h's, the
// integer sums in pmaddwd (16 int16 products a vector, summed in pairs into int32).
namespace avx2 {

ETFUSE_ALWAYS_INLINE void min_max(const float* v, int64_t n, float& mn, float& mx) {
  int64_t i = 0;
  mn = mx = v[0];
  if (n >= 8) {
    __m256 lo = _mm256_loadu_ps(v), hi = lo;
    for (i = 8; i + 8 <= n; i += 8) {
      const __m256 t = _mm256_loadu_ps(v + i);
      lo = _mm256_min_ps(lo, t);
      hi = _mm256_max_ps(hi, t);
    }
    alignas(32) float l[8], h[8];
    _mm256_store_ps(l, lo);
    _mm256_store_ps(h, hi);
    for (int t = 0; t < 8; ++t) {
      mn = l[t] < mn ? l[t] : mn;
      mx = h[t] > mx ? h[t] : mx;
    }
  }
  for (; i < n; ++i) {
    mn = v[i] < mn ? v[i] : mn;
    mx = v[i] > mx ? v[i] : mx;
  }
}

// 8 values: v * inv, round half to even, + zp, clamp, - zp: quantized()'s float32 steps.
ETFUSE_ALWAYS_INLINE __m256i quantize8(const float* v, __m256 inv, __m256 zp) {
  const __m256 lo = _mm256_set1_ps(kQmin), hi = _mm256_set1_ps(kQmax);
  __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, zp), lo), hi);
  return _mm256_cvtps_epi32(_mm256_sub_ps(q, zp));  // integral: exact
}

ETFUSE_ALWAYS_INLINE void quantize(const float* v, int64_t n, float inv, float zp, int16_t* out) {
  const __m256 vinv = _mm256_set1_ps(inv), vzp = _mm256_set1_ps(zp);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packs works per 128-bit lane: [a0-3 b0-3 | a4-7 b4-7]; the permute puts a before b
    const __m256i ab = _mm256_packs_epi32(quantize8(v + i, vinv, vzp), quantize8(v + i + 8, vinv, vzp));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(ab, 0xD8));
  }
  for (; i < n; ++i) out[i] = quantized(v[i], inv, zp);
}

ETFUSE_ALWAYS_INLINE void widen(const Args& a, int64_t n, int16_t* out) {
  const uint8_t* w = a.W + n * a.w_rs;
  if (a.bits == 8) {
    int64_t k = 0;
    for (; k + 16 <= a.K; k += 16) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_cvtepi8_epi16(b));
    }
    for (; k < a.K; ++k) out[k] = static_cast<int8_t>(w[k]);
    return;
  }
  const __m128i mask = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  for (int64_t c = 0; c < a.K; c += kChunk) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c / 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), eight);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), _mm256_cvtepi8_epi16(lo));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c + kChunk / 2), _mm256_cvtepi8_epi16(hi));
  }
}

// Four columns' int32 lanes summed per column: [c0 c1 c2 c3] (both halves' partial sums added).
// By value: an array passed by address kept the accumulators in memory, stored every iteration.
ETFUSE_ALWAYS_INLINE __m128i column_sums(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// dot_groups with groups of kG columns (0: G, known at run time only): per group, each column's
// int32 lanes summed across (column_sums), the zero points' term subtracted in int32 and the four
// sums scaled in one vector; each weight vector loaded once for the R rows.
template <int R, int64_t kG>
ETFUSE_ALWAYS_INLINE void dot_groups_of(const int16_t* const* x, const int32_t* const* gsum, const int16_t* const* w,
                                        int64_t G_, int64_t groups, const float* st, const int32_t* zt,
                                        float (*out)[kCols]) {
  static_assert(kCols == 4, "column_sums sums 4 columns");
  const int64_t G = kG ? kG : G_;
  const int64_t whole = G / 16 * 16;
  __m128 tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G;
    __m256i a0[R], a1[R], a2[R], a3[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = a2[r] = a3[r] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k0 + whole; k += 16) {
      __m256i xv[R];
      for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r] + k));
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0] + k));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[1] + k));
      const __m256i w2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[2] + k));
      const __m256i w3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[3] + k));
      for (int r = 0; r < R; ++r) {
        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(xv[r], w0));
        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(xv[r], w1));
        a2[r] = _mm256_add_epi32(a2[r], _mm256_madd_epi16(xv[r], w2));
        a3[r] = _mm256_add_epi32(a3[r], _mm256_madd_epi16(xv[r], w3));
      }
    }
    const __m128 sv = _mm_loadu_ps(st + g * kCols);
    for (int r = 0; r < R; ++r) {
      __m128i d = column_sums(a0[r], a1[r], a2[r], a3[r]);
      if (whole < G) {  // int8 per-channel weights whose K is not a multiple of 16
        int32_t rest[kCols] = {0, 0, 0, 0};
        for (int c = 0; c < kCols; ++c)
          for (int64_t k = k0 + whole; k < k0 + G; ++k) rest[c] += static_cast<int32_t>(x[r][k]) * w[c][k];
        d = _mm_add_epi32(d, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rest)));
      }
      if (zt) {
        const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(zt + g * kCols));
        d = _mm_sub_epi32(d, _mm_mullo_epi32(z, _mm_set1_epi32(gsum[r][g])));
      }
      tot[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(d), sv, tot[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm_storeu_ps(out[r], tot[r]);
}

// portable::dot_groups on AVX2; torchao's usual groups (32, 64, 128) with their loops unrolled.
template <int R>
ETFUSE_ALWAYS_INLINE void dot_groups(const int16_t* const* x, const int32_t* const* gsum, const int16_t* const* w,
                                     int64_t G, int64_t groups, const float* st, const int32_t* zt,
                                     float (*out)[kCols]) {
  switch (G) {
    case 32: return dot_groups_of<R, 32>(x, gsum, w, G, groups, st, zt, out);
    case 64: return dot_groups_of<R, 64>(x, gsum, w, G, groups, st, zt, out);
    case 128: return dot_groups_of<R, 128>(x, gsum, w, G, groups, st, zt, out);
    default: return dot_groups_of<R, 0>(x, gsum, w, G, groups, st, zt, out);
  }
}

}  // namespace avx2
