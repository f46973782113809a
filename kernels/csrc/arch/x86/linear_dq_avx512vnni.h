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

// How far ahead (bytes) dot_q4 asks for its weight row and scales (avx2::kPrefetchWeights' reason):
// twice AVX2's distance, as this path reads a row in fewer instructions (docs/performance.md).
constexpr int64_t kPrefetchWeights = 2 * avx2::kPrefetchWeights, kPrefetchScales = 2 * avx2::kPrefetchScales;

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

// --- prefill: 16 columns a vector ----------------------------------------------------------
// dot_q4 runs one weight row (one column of C) at a time: across the lanes, summed once per column
// for every 128 columns of K and re-read the rows for every column of C. gemm_q4 puts 16 columns
// of C in the lanes instead: blocks of 16 weight rows are transposed once into `t` (dword w of
// every row side by side: its low nibbles are columns 32 c + 4 j .. + 3 of K, its high ones
// 32 c + 16 + 4 j .. + 3, c = w / 4, j = w % 4), each row of A broadcasts the 4 bytes of qx that
// meet them (quantize_q8's superblock order), and one vpdpbusd takes 64 products for 16 columns.
// Each broadcast feeds kGemmBlocks blocks of 16 columns. The scales are applied once per group
// and row, all columns at once.

// Rows of A from which gemm_q4 runs (fewer: dot_q4), the rows it takes at a time, and the blocks
// of 16 columns.
constexpr int64_t kGemmMinRows = 4;
constexpr int kGemmRows = 4;
constexpr int kGemmBlocks = 2;

// Whether gemm_q4 takes the call: whole superblocks (qx in one order), enough rows, and weight
// rows of whole dwords (its transposes).
inline bool gemm_takes(const Args& a) {
  const int64_t G = a.K / a.groups;
  return a.M >= kGemmMinRows && a.K % 128 == 0 && superblocks(G) && a.w_rs % 4 == 0;
}

// acc + u * (the 4 bytes at x + D, in every lane): vpdpbusd with an embedded broadcast, the load
// folded into the instruction at a constant offset (GCC emits a separate vpbroadcastd when the 4
// bytes feed several vpdpbusd, and an address computation per load for an "m" operand).
template <int D>
ETFUSE_ALWAYS_INLINE __m512i dpbusd_broadcast(__m512i acc, __m512i u, const int8_t* x) {
  asm("vpdpbusd %c[d](%[x])%{1to16%}, %[u], %[acc]"
      : [acc] "+v"(acc)
      : [u] "v"(u), [x] "r"(x), [d] "i"(D), "m"(*reinterpret_cast<const int32_t*>(x + D)));
  return acc;
}

// Rows [m, m + R) of C, columns [j, j + nc) (nc <= 16 B) from the transposed blocks: t holds
// dword w of block b at 16 (B w + b), st and zt group g's at 16 (B g + b).
template <int R, int B>
ETFUSE_ALWAYS_INLINE void gemm_rows(const Args& a, const Rows& rows, int64_t m, int64_t j, int64_t nc,
                                    const int32_t* t, const float* st, const int32_t* zt) {
  const int64_t K = a.K, groups = a.groups, chunks = K / a.groups / 32;  // 4 dwords (32 of K) a chunk
  const __m512i mask = _mm512_set1_epi8(15);
  const int8_t* x[R];
  const int32_t* qs[R];
  __m512 tot[R][B];
  for (int r = 0; r < R; ++r) {
    x[r] = rows.qx + (m + r) * K;
    qs[r] = rows.gsum + (m + r) * groups;
    for (int b = 0; b < B; ++b) tot[r][b] = _mm512_setzero_ps();
  }
  int64_t c = 0;  // chunk
  for (int64_t g = 0; g < groups; ++g) {
    // the sums start at -(8 + zp) * sum qx: one broadcast per row when every zero point is 0
    __m512i acc[R][B];
    if (zt) {
      for (int r = 0; r < R; ++r) {
        const __m512i nq = _mm512_set1_epi32(-qs[r][g]);
        for (int b = 0; b < B; ++b) acc[r][b] = _mm512_mullo_epi32(_mm512_loadu_si512(zt + 16 * (B * g + b)), nq);
      }
    } else {
      for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) acc[r][b] = _mm512_set1_epi32(-8 * qs[r][g]);
    }
    for (const int64_t c1 = c + chunks; c < c1; ++c) {
      const int64_t off = 128 * (c >> 2) + 16 * (c & 3);  // qx of the chunk's low nibbles; high: + 64
      const int32_t* tc = t + 16 * B * 4 * c;
      const int8_t* xc[R];
      for (int r = 0; r < R; ++r) xc[r] = x[r] + off;
      // dword U of the chunk (a template argument: the broadcasts' offsets are constants)
      const auto word = [&](auto step) __attribute__((always_inline)) {
        constexpr int U = decltype(step)::value;
        __m512i lo[B], hi[B];
        for (int b = 0; b < B; ++b) {
          const __m512i v = _mm512_loadu_si512(tc + 16 * (B * U + b));
          lo[b] = _mm512_and_si512(v, mask);
          hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        }
        for (int r = 0; r < R; ++r) {
          for (int b = 0; b < B; ++b) {
            acc[r][b] = dpbusd_broadcast<4 * U>(acc[r][b], lo[b], xc[r]);
            acc[r][b] = dpbusd_broadcast<64 + 4 * U>(acc[r][b], hi[b], xc[r]);
          }
        }
      };
      word(std::integral_constant<int, 0>{});
      word(std::integral_constant<int, 1>{});
      word(std::integral_constant<int, 2>{});
      word(std::integral_constant<int, 3>{});
    }
    for (int b = 0; b < B; ++b) {
      const __m512 sv = _mm512_loadu_ps(st + 16 * (B * g + b));
      for (int r = 0; r < R; ++r) tot[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][b]), sv, tot[r][b]);
    }
  }
  // store_q8 on 16 columns a block
  for (int b = 0; b < B; ++b) {
    const int64_t jb = j + 16 * b, nb = nc - 16 * b;
    if (nb <= 0) break;
    const __mmask16 cols = static_cast<__mmask16>(nb >= 16 ? 0xffffu : (1u << nb) - 1u);
    const __m512 rs = _mm512_maskz_loadu_ps(cols, a.row_sums + jb);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(cols, a.bias + jb) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const int64_t mm = m + r;
      __m512 y = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(rows.zx[mm])), rs, tot[r][b]);
      y = _mm512_fmadd_ps(y, _mm512_set1_ps(rows.scale[mm]), bias);
      if (a.residual) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(cols, a.residual + mm * a.r_rs + jb));
      _mm512_mask_storeu_ps(a.C + mm * a.c_rs + jb, cols, y);
    }
  }
}

// out[e], lane c = dword e of in[c] (16 x 16 dwords): pairs, then quads within 128-bit lanes,
// then the lanes themselves; 64 shuffles where 16 gathers of 16 rows were a fifth of gemm_q4's time.
ETFUSE_ALWAYS_INLINE void transpose16x16(const __m512i (&in)[16], __m512i (&out)[16]) {
  __m512i a[16], s[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    s[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    s[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    s[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    s[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // s[4 i + k], 128-bit lane L: dword 4 L + k of in[4 i .. 4 i + 3]
  for (int k = 0; k < 4; ++k) {
    const __m512i lo01 = _mm512_shuffle_i32x4(s[k], s[4 + k], 0x44), hi01 = _mm512_shuffle_i32x4(s[k], s[4 + k], 0xee);
    const __m512i lo23 = _mm512_shuffle_i32x4(s[8 + k], s[12 + k], 0x44);
    const __m512i hi23 = _mm512_shuffle_i32x4(s[8 + k], s[12 + k], 0xee);
    out[k] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
    out[4 + k] = _mm512_shuffle_i32x4(lo01, lo23, 0xdd);
    out[8 + k] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
    out[12 + k] = _mm512_shuffle_i32x4(hi01, hi23, 0xdd);
  }
}

// dst[16 * stride * i] lane c = src_c[i] for i in [0, n) (n a multiple of 16): 16 rows of dwords
// side by side, 16 x 16 at a time.
ETFUSE_ALWAYS_INLINE void transpose_rows(const int32_t* const (&src)[16], int64_t n, int32_t* dst, int64_t stride) {
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    __m512i in[16], out[16];
    for (int c = 0; c < 16; ++c) in[c] = _mm512_loadu_si512(src[c] + i0);
    transpose16x16(in, out);
    for (int e = 0; e < 16; ++e) _mm512_storeu_si512(dst + 16 * stride * (i0 + e), out[e]);
  }
}

// Columns [j0, j1) of C for every row (gemm_takes(a)): per kGemmBlocks blocks of 16 weight rows,
// their packed dwords, scales and (8 + zero points) transposed, then kGemmRows rows of A at a time.
inline void gemm_q4(const Args& a, const Rows& rows, int64_t j0, int64_t j1) {
  constexpr int B = kGemmBlocks;
  const int64_t K = a.K, groups = a.groups, words = K / 8;
  thread_local std::vector<int32_t> tv, ztv;
  thread_local std::vector<float> stv;
  tv.resize(static_cast<size_t>(16 * B * words));
  stv.resize(static_cast<size_t>(16 * B * groups));
  ztv.resize(a.zp ? static_cast<size_t>(16 * B * groups) : 0);
  int32_t* const t = tv.data();
  float* const st = stv.data();
  int32_t* const zt = a.zp ? ztv.data() : nullptr;
  for (int64_t j = j0; j < j1; j += 16 * B) {
    const int64_t nc = j1 - j < 16 * B ? j1 - j : 16 * B;
    for (int b = 0; b < B; ++b) {
      // past the last column: the first row again, not stored
      int64_t row[16];
      const int32_t* wrow[16];
      const int32_t* srow[16];
      for (int c = 0; c < 16; ++c) {
        row[c] = j + (16 * b + c < nc ? 16 * b + c : 0);
        wrow[c] = reinterpret_cast<const int32_t*>(a.W + row[c] * a.w_rs);  // gemm_takes: words % 16 == 0
        srow[c] = reinterpret_cast<const int32_t*>(a.scales + row[c] * groups);
      }
      transpose_rows(wrow, words, t + 16 * b, B);
      const int64_t whole = groups / 16 * 16;  // the scales' last groups % 16: one by one
      transpose_rows(srow, whole, reinterpret_cast<int32_t*>(st) + 16 * b, B);
      for (int64_t g = whole; g < groups; ++g)
        for (int c = 0; c < 16; ++c) st[16 * (B * g + b) + c] = a.scales[row[c] * groups + g];
      if (zt) {
        for (int64_t g = 0; g < groups; ++g)
          for (int c = 0; c < 16; ++c) zt[16 * (B * g + b) + c] = 8 + a.zp[row[c] * groups + g];
      }
    }
    int64_t m = 0;
    for (; m + kGemmRows <= a.M; m += kGemmRows) gemm_rows<kGemmRows, B>(a, rows, m, j, nc, t, st, zt);
    for (; m < a.M; ++m) gemm_rows<1, B>(a, rows, m, j, nc, t, st, zt);
  }
}

}  // namespace vnni
