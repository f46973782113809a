// linear_dq's primitives on AVX2 (core/linear_dq.h includes this inside namespace linear_dq, under
// `#pragma GCC target("avx2,fma,f16c")`): the same results as core/linear_dq_portable.h's. int8
// weights: the integer sums in pmaddwd (16 int16 products a vector, summed in pairs into int32).
// int4 weights (the q4 primitives at the end): maddubs on the raw nibbles and the raw int8 rows.
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

// portable::dot_groups_of on AVX2 (groups of kG columns; 0: G, known at run time only): per group,
// each column's int32 lanes summed across (column_sums), the zero points' term subtracted in int32
// and the four sums scaled in one vector; each weight vector loaded once for the R rows.
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

// --- int4 weights on the raw int8 rows (core/linear_dq.h "q4") ---------------------------------
//
// A 32-byte load of a packed weight row holds two 32-column chunks; `& 15` gives columns 0-15 of
// both (lo), `>> 4 & 15` columns 16-31 (hi). quantize_q8 stores each row's 64-column blocks in
// that order ([0-15, 32-47], [16-31, 48-63]), so lo and hi multiply x as loaded. A last lone
// chunk (K % 64 == 32) stays in column order and is read 16 bytes at a time.
// maddubs(u, qx): u = q + 8 in [0, 15] unsigned, qx signed: a pair of products is at most
// 2 * 15 * 128 = 3840 in magnitude and two pairs 7680, never saturating int16.

// 32 values -> clamp(rint(v * inv) + zp, -128, 127) as int8, in order.
ETFUSE_ALWAYS_INLINE __m256i quantize32(const float* v, __m256 inv, __m256 zp) {
  const __m256 lo = _mm256_set1_ps(kQmin), hi = _mm256_set1_ps(kQmax);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), inv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zp), lo), hi));
  }
  // packs per 128-bit lane: dwords [a0 b0 c0 d0 | a1 b1 c1 d1] (a0: a's first 4 bytes); in order after the permute
  const __m256i s = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One row: qx (int8, the q4 order above) and its sums over each group of G columns (a multiple of 32).
// `superblocks` (AVX-512 VNNI's order, arch/x86/linear_dq_avx512vnni.h): each whole 128-column
// block as a 64-byte load of its packed weight reads it, [0-15, 32-47, 64-79, 96-111] (the low
// nibbles) then [16-31, 48-63, 80-95, 112-127] (the high ones); what is left of K as above.
ETFUSE_ALWAYS_INLINE void quantize_q8(const float* v, int64_t K, int64_t G, float inv, float zp, int8_t* out,
                                      int32_t* qsum, bool superblocks = false) {
  const __m256 vinv = _mm256_set1_ps(inv), vzp = _mm256_set1_ps(zp);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
  for (int64_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    __m256i acc = zero;  // sad's four 64-bit sums of qx + 128
    for (int64_t k = k0; k < k0 + G; k += kChunk) {
      const __m256i q = quantize32(v + k, vinv, vzp);
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_xor_si256(q, flip), zero));
      const int64_t super = k & ~int64_t(127), block = k & ~int64_t(63);
      if (superblocks && super + 128 <= K) {
        const int64_t chunk = (k >> 5) & 3;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + super + 16 * chunk), _mm256_castsi256_si128(q));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + super + 64 + 16 * chunk), _mm256_extracti128_si256(q, 1));
      } else if (block + 64 <= K) {
        const int64_t half = (k >> 5) & 1;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + block + 16 * half), _mm256_castsi256_si128(q));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + block + 32 + 16 * half), _mm256_extracti128_si256(q, 1));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), q);
      }
    }
    const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    qsum[g] = static_cast<int32_t>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 128 * static_cast<int32_t>(G);
  }
}

// The int16 sums of u * qx over one 64-column block (two chunks) for R rows: [8 lanes of the
// first chunk | 8 of the second], each of 4 products (x[r] at the block).
template <int R>
ETFUSE_ALWAYS_INLINE void block_sums16(const uint8_t* w, const int8_t* const* x, int64_t off, __m256i* E) {
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  for (int r = 0; r < R; ++r) {
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r] + off));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r] + off + 32));
    E[r] = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
  }
}

// The same in int32: [4 lanes of the first chunk | 4 of the second].
template <int R>
ETFUSE_ALWAYS_INLINE void block_sums(const uint8_t* w, const int8_t* const* x, int64_t off, __m256i* P) {
  block_sums16<R>(w, x, off, P);
  for (int r = 0; r < R; ++r) P[r] = _mm256_madd_epi16(P[r], _mm256_set1_epi16(1));
}

// A lone last chunk (x in column order), int16: [8 lanes | 0].
template <int R>
ETFUSE_ALWAYS_INLINE void chunk_sums16(const uint8_t* w, const int8_t* const* x, int64_t off, __m256i* E) {
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  const __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  for (int r = 0; r < R; ++r) {
    const __m128i xl = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r] + off));
    const __m128i xh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r] + off + 16));
    E[r] = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                   _mm_add_epi16(_mm_maddubs_epi16(lo, xl), _mm_maddubs_epi16(hi, xh)), 0);
  }
}

// S[r] = the sums of u * qx over each of ng <= 8 groups of 32 columns from the packed row w and
// x[r] (both at the first group), as int32 [g0 .. g7] (0 past ng). Two rounds of hadd_epi16 sum
// 4 lanes of at most 4 * 1920 each (30720: no wrap), madd the last pair into int32.
template <int R>
ETFUSE_ALWAYS_INLINE void group_sums_g32(const uint8_t* w, const int8_t* const* x, int64_t ng, __m256i* S) {
  __m256i H[2][R];
  for (int half = 0; half < 2; ++half) {
    __m256i E[2][R];
    for (int b = 0; b < 2; ++b) {
      const int64_t it = 2 * half + b;  // the block of groups 2 it and 2 it + 1
      if (2 * it + 1 < ng) {
        block_sums16<R>(w + 32 * it, x, 64 * it, E[b]);
      } else if (2 * it < ng) {
        chunk_sums16<R>(w + 32 * it, x, 64 * it, E[b]);
      } else {
        for (int r = 0; r < R; ++r) E[b][r] = _mm256_setzero_si256();
      }
    }
    for (int r = 0; r < R; ++r) H[half][r] = _mm256_hadd_epi16(E[0][r], E[1][r]);
  }
  // hadd(hadd(E0, E1), hadd(E2, E3)): pairs [g0 g2 g4 g6 | g1 g3 g5 g7]; madd sums each pair
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) {
    const __m256i pairs = _mm256_hadd_epi16(H[0][r], H[1][r]);
    S[r] = _mm256_permutevar8x32_epi32(_mm256_madd_epi16(pairs, ones), order);
  }
}

// The same for groups of G columns, a multiple of 64.
template <int R>
ETFUSE_ALWAYS_INLINE void group_sums_g64(const uint8_t* w, const int8_t* const* x, int64_t G, int64_t ng,
                                         __m256i* S) {
  __m256i Q[2][R];  // groups 0-3, 4-7: [g0 g1 g2 g3 (first lanes) | g0 g1 g2 g3 (the others)]
  for (int quad = 0; quad < 2; ++quad) {
    __m256i H[2][R];
    for (int pair = 0; pair < 2; ++pair) {
      __m256i P[2][R];
      for (int b = 0; b < 2; ++b) {
        const int64_t i = 4 * quad + 2 * pair + b;
        for (int r = 0; r < R; ++r) P[b][r] = _mm256_setzero_si256();
        if (i >= ng) continue;
        for (int64_t k = i * G; k < (i + 1) * G; k += 64) {
          __m256i T[R];
          block_sums<R>(w + (k >> 1), x, k, T);
          for (int r = 0; r < R; ++r) P[b][r] = _mm256_add_epi32(P[b][r], T[r]);
        }
      }
      for (int r = 0; r < R; ++r) H[pair][r] = _mm256_hadd_epi32(P[0][r], P[1][r]);
    }
    for (int r = 0; r < R; ++r) Q[quad][r] = _mm256_hadd_epi32(H[0][r], H[1][r]);
  }
  for (int r = 0; r < R; ++r) {
    S[r] = _mm256_add_epi32(_mm256_permute2x128_si256(Q[0][r], Q[1][r], 0x20),
                            _mm256_permute2x128_si256(Q[0][r], Q[1][r], 0x31));
  }
}

// tot[r] += scale[n, g] * D'[r, g] for weight row n, groups [g0, g1) and R rows of A (Rows' q4
// fields, from row m), 8 groups a vector: D' = S - (8 + zp) * sum qx in int32 (core/linear_dq.h).
// How far ahead (bytes) it asks for its weight row and scales: a decode step streams every
// weight once, and one core's misses in flight did not keep up with the bandwidth (the loads'
// stalls were most of dot_q4's time); about a microsecond of the stream ahead covers the latency.
constexpr int64_t kPrefetchWeights = 1536, kPrefetchScales = 384;
template <int R, bool kG32>
ETFUSE_ALWAYS_INLINE void accumulate_q4(const Args& a, const Rows& rows, int64_t m, int64_t n, int64_t g0, int64_t g1,
                                        __m256* tot) {
  const int64_t K = a.K, groups = a.groups, G = K / groups;
  const uint8_t* w = a.W + n * a.w_rs;
  const float* sc = a.scales + n * groups;
  const int8_t* zp = a.zp ? a.zp + n * groups : nullptr;
  const int8_t* x[R];
  const int32_t* qs[R];
  for (int r = 0; r < R; ++r) {
    x[r] = rows.qx + (m + r) * K;
    qs[r] = rows.gsum + (m + r) * groups;
  }
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t g = g0; g < g1; g += 8) {
    const int64_t ng = g1 - g < 8 ? g1 - g : 8;
    const int8_t* xg[R];
    for (int r = 0; r < R; ++r) xg[r] = x[r] + g * G;
    {
      const char* pw = reinterpret_cast<const char*>(w + g * G / 2) + kPrefetchWeights;
      _mm_prefetch(pw, _MM_HINT_T0);
      _mm_prefetch(pw + 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sc + g) + kPrefetchScales, _MM_HINT_T0);
    }
    __m256i S[R];
    if (kG32) {
      if (ng == 8) group_sums_g32<R>(w + g * 16, xg, 8, S);
      else group_sums_g32<R>(w + g * 16, xg, ng, S);
    } else {
      group_sums_g64<R>(w + g * G / 2, xg, G, ng, S);
    }
    __m256 sv;
    __m256i zv = _mm256_setzero_si256(), qv[R];
    if (ng == 8) {
      sv = _mm256_loadu_ps(sc + g);
      if (zp) zv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zp + g)));
      for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[r] + g));
    } else {  // the last groups: zero past them (their sums are 0 too)
      alignas(32) float s8[8] = {};
      alignas(32) int32_t z8[8] = {}, q8[R][8] = {};
      for (int64_t i = 0; i < ng; ++i) {
        s8[i] = sc[g + i];
        z8[i] = zp ? zp[g + i] : 0;
        for (int r = 0; r < R; ++r) q8[r][i] = qs[r][g + i];
      }
      sv = _mm256_load_ps(s8);
      zv = _mm256_load_si256(reinterpret_cast<const __m256i*>(z8));
      for (int r = 0; r < R; ++r) qv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(q8[r]));
    }
    const __m256i z8v = _mm256_add_epi32(zv, eight);
    for (int r = 0; r < R; ++r) {
      const __m256i rowterm = zp ? _mm256_mullo_epi32(z8v, qv[r]) : _mm256_slli_epi32(qv[r], 3);
      tot[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[r], rowterm)), sv, tot[r]);
    }
  }
}

ETFUSE_ALWAYS_INLINE float sum_lanes(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// Rows of A dot_q4 takes at a time (core/linear_dq_rows.h cols_q4_of): 16 vector registers.
constexpr int kQ4Rows = 2;

// out[r] = sum_g scale[n, g] * D'[r, g] for weight row n and R rows of A (from row m).
template <int R, bool kG32>
ETFUSE_ALWAYS_INLINE void dot_q4(const Args& a, const Rows& rows, int64_t m, int64_t n, float* out) {
  __m256 tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm256_setzero_ps();
  accumulate_q4<R, kG32>(a, rows, m, n, 0, a.groups, tot);
  for (int r = 0; r < R; ++r) out[r] = sum_lanes(tot[r]);
}

}  // namespace avx2
