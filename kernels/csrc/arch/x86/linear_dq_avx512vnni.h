// linear_dq's int4 path on AVX-512 VNNI (core/linear_dq.h includes this inside namespace linear_dq,
// after arch/x86/linear_dq_avx2.h, under `#pragma GCC target` with avx512vnni). vpdpbusd adds 4
// products u * qx (u8 x s8) into each int32 lane, so the nibbles need no int16 step and no sums
// across lanes per group: a 64-byte load of a packed weight row is 128 columns (a superblock),
// `& 15` and `>> 4 & 15` give its 64 + 64 nibbles, and quantize_q8 stores the rows' qx in the order
// those two halves read them (avx2::quantize_q8's superblocks). The int16 path (int8 weights), group
// sizes that do not fall on superblocks, and the columns past the last superblock are AVX2's code.
namespace vnni {

using avx2::dot_groups_of;
using avx2::min_max;
using avx2::quantize;
using avx2::widen;

// Whether groups of G columns fall on superblocks as dot_q4 sums them: 4 groups a superblock (32),
// 2 (64), or whole superblocks a group (a multiple of 128).
inline bool superblocks(int64_t G) { return G == 32 || G == 64 || G % 128 == 0; }

ETFUSE_ALWAYS_INLINE void quantize_q8(const float* v, int64_t K, int64_t G, float inv, float zp, int8_t* out,
                                      int32_t* qsum) {
  avx2::quantize_q8(v, K, G, inv, zp, out, qsum, superblocks(G));
}

// Rows of A dot_q4 takes at a time: 32 vector registers hold 4 rows' sums beside the nibbles.
constexpr int kQ4Rows = 4;

// How far ahead (bytes) dot_q4 asks for its weight row and scales (avx2::kPrefetchWeights' reason).
constexpr int64_t kPrefetchWeights = avx2::kPrefetchWeights, kPrefetchScales = avx2::kPrefetchScales;

// Superblock `sb`'s u * qx sums for R rows added into acc[r]: 16 int32 lanes, lane l from
// columns of the superblock's group l / 4 (G = 32), l / 8 (G = 64) or its one group (G >= 128).
template <int R>
ETFUSE_ALWAYS_INLINE void superblock_sums(const uint8_t* w, const int8_t* const* x, int64_t sb, __m512i* acc) {
  const __m512i mask = _mm512_set1_epi8(15);
  _mm_prefetch(reinterpret_cast<const char*>(w + 64 * sb) + kPrefetchWeights, _MM_HINT_T0);
  const __m512i v = _mm512_loadu_si512(w + 64 * sb);
  const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_dpbusd_epi32(acc[r], lo, _mm512_loadu_si512(x[r] + 128 * sb));
    acc[r] = _mm512_dpbusd_epi32(acc[r], hi, _mm512_loadu_si512(x[r] + 128 * sb + 64));
  }
}

// out[r] = sum_g scale[n, g] * D'[r, g] for weight row n and R rows of A (Rows' q4 fields, from
// row m), D' = S - (8 + zp) * sum qx (core/linear_dq.h), in two float sums: scale * S per lane,
// each superblock's sums scaled by their groups' scales (16 groups' scales loaded at a time and
// spread over the lanes), and scale * (8 + zp) * sum qx over 16 groups a vector; summed across
// lanes once per column.
template <int R, bool kG32>
ETFUSE_ALWAYS_INLINE void dot_q4(const Args& a, const Rows& rows, int64_t m, int64_t n, float* out) {
  const int64_t K = a.K, groups = a.groups, G = K / groups;
  if (!superblocks(G)) {
    avx2::dot_q4<R, kG32>(a, rows, m, n, out);
    return;
  }
  const int64_t whole = K / 128, covered = whole * 128 / G;  // groups in whole superblocks
  const uint8_t* w = a.W + n * a.w_rs;
  const float* sc = a.scales + n * groups;
  const int8_t* zp = a.zp ? a.zp + n * groups : nullptr;
  const int8_t* x[R];
  const int32_t* qs[R];
  __m512 tot[R], rowterm[R];
  for (int r = 0; r < R; ++r) {
    x[r] = rows.qx + (m + r) * K;
    qs[r] = rows.gsum + (m + r) * groups;
    tot[r] = rowterm[r] = _mm512_setzero_ps();
  }
  const __m512i step = kG32 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                            : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const int64_t per = G <= 64 ? 128 / G : 1;  // groups a superblock (G >= 128: one, in whole superblocks)
  for (int64_t g0 = 0; g0 < covered; g0 += 16) {
    const int64_t ng = covered - g0 < 16 ? covered - g0 : 16;
    const __mmask16 some = static_cast<__mmask16>((1u << ng) - 1u);
    _mm_prefetch(reinterpret_cast<const char*>(sc + g0) + kPrefetchScales, _MM_HINT_T0);
    const __m512 s16 = _mm512_maskz_loadu_ps(some, sc + g0);
    __m512 z16 = _mm512_set1_ps(8.0f);
    if (zp) z16 = _mm512_add_ps(z16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(some, zp + g0))));
    const __m512 c16 = _mm512_mul_ps(s16, z16);
    for (int r = 0; r < R; ++r) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(some, qs[r] + g0));
      rowterm[r] = _mm512_fmadd_ps(c16, q, rowterm[r]);
    }
    if (G <= 64) {
      for (int64_t j = 0; j * per < ng; ++j) {
        __m512i acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
        superblock_sums<R>(w, x, g0 / per + j, acc);
        const __m512i idx = _mm512_add_epi32(step, _mm512_set1_epi32(static_cast<int>(j * per)));
        const __m512 sv = _mm512_permutexvar_ps(idx, s16);
        for (int r = 0; r < R; ++r) tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), sv, tot[r]);
      }
    } else {
      const int64_t spg = G / 128;  // superblocks a group
      for (int64_t g = g0; g < g0 + ng; ++g) {
        __m512i acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
        for (int64_t sb = g * spg; sb < (g + 1) * spg; ++sb) superblock_sums<R>(w, x, sb, acc);
        const __m512 sv = _mm512_set1_ps(sc[g]);
        for (int r = 0; r < R; ++r) tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), sv, tot[r]);
      }
    }
  }
  __m256 rest[R];  // the columns past the last superblock (G <= 64 only): AVX2's code
  for (int r = 0; r < R; ++r) rest[r] = _mm256_setzero_ps();
  if (covered < groups) avx2::accumulate_q4<R, kG32>(a, rows, m, n, covered, groups, rest);
  for (int r = 0; r < R; ++r) {
    out[r] = _mm512_reduce_add_ps(_mm512_sub_ps(tot[r], rowterm[r])) + avx2::sum_lanes(rest[r]);
  }
}

}  // namespace vnni
