// linear_qw's dot-product kernel (core/linear_qw.h) for one vector width: included once per ISA
// with ETFUSE_QW_NS (its namespace), ETFUSE_QW_W (floats per vector) and, for the AVX2 and
// AVX-512 copies, ETFUSE_QW_AVX2 or ETFUSE_QW_AVX512 (int8 -> float through intrinsics: GCC's
// generic int8 vector conversions go through scalar lanes). No include guard, on purpose.
#if defined(ETFUSE_QW_AVX2) || defined(ETFUSE_QW_AVX512)
#include <immintrin.h>
#endif

namespace ETFUSE_QW_NS {

constexpr int W = ETFUSE_QW_W;
typedef typename gemm::detail::Vec<W>::type vf;
typedef float vfu __attribute__((vector_size(W * 4), aligned(4), may_alias));  // an unaligned load

// W int8 weights at p -> W floats.
ETFUSE_ALWAYS_INLINE vf q8(const uint8_t* p) {
#if defined(ETFUSE_QW_AVX512)
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(ETFUSE_QW_AVX2)
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  vf out;
  for (int t = 0; t < W; ++t) out[t] = static_cast<float>(static_cast<int8_t>(p[t]));
  return out;
#endif
}

// One 32-column chunk of 4-bit weights (16 bytes at p) -> kChunk / W vectors, in column order.
ETFUSE_ALWAYS_INLINE void q4(const uint8_t* p, vf (&out)[kChunk / W]) {
#if defined(ETFUSE_QW_AVX512)
  // A 16-float table lookup per nibble: vpermps reads only the low 4 bits of each index, so the
  // bytes widened to 32 bits index the table as they are (low nibbles) and shifted right by 4
  // (high nibbles), no masks: a widening and two lookups per 32 weights, where the AVX2 path
  // needs two byte shuffles, four unpacks and four half-to-float conversions.
  const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  out[0] = (vf)_mm512_permutexvar_ps(bytes, values);
  out[1] = (vf)_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values);
#elif defined(ETFUSE_QW_AVX2)
  // Through half precision: every q - 8 in [-8, 7] is a half whose low byte is 0, so one byte
  // shuffle maps the nibbles to the halves' high bytes, an unpack beside zero bytes makes the
  // halves, and vcvtph2ps widens 8 at a time: 14 uops on Zen 1 against 22 for sign-extending to
  // int32 and converting (linear_qw's decode is bound by these conversions, not by memory).
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(15), zero = _mm_setzero_si128();
  const __m128i half_hi = _mm_setr_epi8(char(0xC8), char(0xC7), char(0xC6), char(0xC5), char(0xC4), char(0xC2),
                                        char(0xC0), char(0xBC), 0x00, 0x3C, 0x40, 0x42, 0x44, 0x45, 0x46, 0x47);
  const __m128i lo = _mm_shuffle_epi8(half_hi, _mm_and_si128(b, mask));
  const __m128i hi = _mm_shuffle_epi8(half_hi, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
  out[0] = (vf)_mm256_cvtph_ps(_mm_unpacklo_epi8(zero, lo));
  out[1] = (vf)_mm256_cvtph_ps(_mm_unpackhi_epi8(zero, lo));
  out[2] = (vf)_mm256_cvtph_ps(_mm_unpacklo_epi8(zero, hi));
  out[3] = (vf)_mm256_cvtph_ps(_mm_unpackhi_epi8(zero, hi));
#else
  for (int t = 0; t < kChunk / W; ++t) {
    for (int l = 0; l < W; ++l) {
      const int i = t * W + l;
      const uint8_t b = p[i & 15];
      out[t][l] = static_cast<float>((i < 16 ? (b & 15) : (b >> 4)) - 8);
    }
  }
#endif
}

// Software prefetch, spread over a block's first row of A: the next block's weight rows, a
// cache line per 64 bytes as this block streams its own, and their scales, a line per 16
// groups (pf: null for the other rows). The rows are short (K / 2 bytes at 4 bits) and without
// it the hardware prefetcher streamed a weight that is not in cache 1.4x slower
// (benchmarks/weight_only.py --cold; the whole next block at once at the block's start: slower
// for long rows).
struct Prefetch {
  const uint8_t* w[4];
  const float* s[4];
};

ETFUSE_ALWAYS_INLINE void prefetch_weights(const Prefetch* pf, int64_t byte) {
  if (pf && (byte & 63) == 0)
    for (int c = 0; c < 4; ++c) __builtin_prefetch(pf->w[c] + byte);
}

ETFUSE_ALWAYS_INLINE void prefetch_scales(const Prefetch* pf, int64_t g) {
  if (pf && (g & 15) == 0)
    for (int c = 0; c < 4; ++c) __builtin_prefetch(pf->s[c] + g);
}

// Row m of C, columns [j, j + nj) (nj <= 4; w[c] for c >= nj repeats a valid row of the weight).
ETFUSE_ALWAYS_INLINE void dot_row(const Args& a, int64_t m, int64_t j, int64_t nj, const uint8_t* const* w,
                                  const Prefetch* pf) {
  const float* x = a.A + m * a.a_rs;
  const int64_t G = a.K / a.groups;
  vf tot[4] = {vf{}, vf{}, vf{}, vf{}};
  float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float* sc[4];
  const int8_t* zp[4];
  for (int c = 0; c < 4; ++c) {
    const int64_t n = j + (c < nj ? c : 0);
    sc[c] = a.scales + n * a.groups;
    zp[c] = a.zp ? a.zp + n * a.groups : nullptr;
  }
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t k0 = g * G, k1 = k0 + G;
    prefetch_scales(pf, g);
    // two sums per column: 8 independent multiply-add chains hide the FMA latency
    vf acc[4] = {vf{}, vf{}, vf{}, vf{}}, acc2[4] = {vf{}, vf{}, vf{}, vf{}};
    float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (a.bits == 4 && G == kChunk) {
      // one chunk per group (groups of 32, torchao's usual): one multiply-add chain per column
      // straight into the scaled total, 5 vector ops per column and chunk instead of 6
      prefetch_weights(pf, k0 / 2);
      vf xv[kChunk / W];
      for (int t = 0; t < kChunk / W; ++t) xv[t] = *reinterpret_cast<const vfu*>(x + k0 + t * W);
      for (int c = 0; c < 4; ++c) {
        vf wv[kChunk / W];
        q4(w[c] + k0 / 2, wv);
        vf p = xv[0] * wv[0];
        for (int t = 1; t < kChunk / W; ++t) p += xv[t] * wv[t];
        tot[c] += p * sc[c][g];
        if (a.zp) tail[c] -= static_cast<float>(zp[c][g]) * sc[c][g] * a.xsum[m * a.groups + g];
      }
      continue;
    }
    if (a.bits == 4) {  // G is a multiple of the chunk
      for (int64_t k = k0; k < k1; k += kChunk) {
        prefetch_weights(pf, k / 2);
        vf xv[kChunk / W];  // plain loads, not memcpy: GCC turns a memcpy loop into a stack copy
        for (int t = 0; t < kChunk / W; ++t) xv[t] = *reinterpret_cast<const vfu*>(x + k + t * W);
        for (int c = 0; c < 4; ++c) {
          vf wv[kChunk / W];
          q4(w[c] + k / 2, wv);
          for (int t = 0; t < kChunk / W; t += 2) {
            acc[c] += xv[t] * wv[t];
            acc2[c] += xv[t + 1] * wv[t + 1];
          }
        }
      }
    } else {
      int64_t k = k0;
      for (; k + 2 * W <= k1; k += 2 * W) {
        prefetch_weights(pf, k);
        vf x0, x1;
        std::memcpy(&x0, x + k, sizeof(vf));
        std::memcpy(&x1, x + k + W, sizeof(vf));
        for (int c = 0; c < 4; ++c) {
          acc[c] += x0 * q8(w[c] + k);
          acc2[c] += x1 * q8(w[c] + k + W);
        }
      }
      for (; k + W <= k1; k += W) {
        vf xv;
        std::memcpy(&xv, x + k, sizeof(vf));
        for (int c = 0; c < 4; ++c) acc[c] += xv * q8(w[c] + k);
      }
      for (; k < k1; ++k)
        for (int c = 0; c < 4; ++c) rest[c] += x[k] * static_cast<float>(static_cast<int8_t>(w[c][k]));
    }
    for (int c = 0; c < 4; ++c) {
      const float s = sc[c][g];
      tot[c] += (acc[c] + acc2[c]) * s;
      if (a.bits == 8) tail[c] += rest[c] * s;
      if (a.zp) tail[c] -= static_cast<float>(zp[c][g]) * s * a.xsum[m * a.groups + g];
    }
  }
  for (int c = 0; c < nj; ++c) {
    float sum = gemm::detail::hsum<W>(tot[c]) + tail[c];
    if (a.bias) sum += a.bias[j + c];
    if (a.residual) sum += a.residual[m * a.r_rs + j + c];
    a.C[m * a.c_rs + j + c] = sum;
  }
}

inline void dot_cols(const Args& a, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    const uint8_t* w[4];
    for (int c = 0; c < 4; ++c) w[c] = a.W + (j + (c < nj ? c : 0)) * a.w_rs;
    Prefetch next;
    for (int c = 0; c < 4; ++c) {
      const int64_t n = j + 4 + c < j1 ? j + 4 + c : j;  // past the last block: this block again
      next.w[c] = a.W + n * a.w_rs;
      next.s[c] = a.scales + n * a.groups;
    }
    for (int64_t m = 0; m < a.M; ++m) dot_row(a, m, j, nj, w, m == 0 ? &next : nullptr);
  }
}

// Weight rows [j, j + nj) dequantized into scratch rows of K floats, (q - zp) * scale as the
// pattern computes it.
ETFUSE_ALWAYS_INLINE void dequantize_rows(const Args& a, int64_t j, int64_t nj, float* scratch) {
  const int64_t G = a.K / a.groups;
  for (int64_t c = 0; c < nj; ++c) {
    const int64_t n = j + c;
    const uint8_t* w = a.W + n * a.w_rs;
    float* dst = scratch + c * a.K;
    for (int64_t g = 0; g < a.groups; ++g) {
      const float s = a.scales[n * a.groups + g];
      const float z = a.zp ? static_cast<float>(a.zp[n * a.groups + g]) : 0.0f;
      int64_t k = g * G;
      const int64_t k1 = k + G;
      if (a.bits == 4) {
        for (; k < k1; k += kChunk) {
          vf wv[kChunk / W];
          q4(w + k / 2, wv);
          for (int t = 0; t < kChunk / W; ++t) {
            const vf v = (wv[t] - z) * s;
            gemm::detail::store<W>(dst + k + t * W, v);
          }
        }
      } else {
        for (; k + W <= k1; k += W) {
          const vf v = (q8(w + k) - z) * s;
          gemm::detail::store<W>(dst + k, v);
        }
        for (; k < k1; ++k) dst[k] = (static_cast<float>(static_cast<int8_t>(w[k])) - z) * s;
      }
    }
  }
}

// More rows (prefill): each block of 4 weight rows is dequantized once into an L1-sized scratch
// and every row of A runs the float GEMM's dot products over it (gemm.h dot_block).
inline void rows_cols(const Args& a, int64_t j0, int64_t j1) {
  std::vector<float> scratch(static_cast<size_t>(4 * a.K));
  gemm::Args g = float_gemm(a);
  g.b_rs = 1;
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    dequantize_rows(a, j, nj, scratch.data());
    const float* b[4];
    for (int c = 0; c < 4; ++c) b[c] = scratch.data() + (c < nj ? c : 0) * a.K;
    int64_t i = 0;
    for (; i + 2 <= a.M; i += 2) gemm::detail::dot_block<W, 2>(g, i, j, nj, b);
    if (i < a.M) gemm::detail::dot_block<W, 1>(g, i, j, nj, b);
  }
}

}  // namespace ETFUSE_QW_NS
