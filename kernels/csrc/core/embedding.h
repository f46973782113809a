// The quantized embedding core of quantized_decomposed::embedding_byte / embedding_4bit /
// embedding_2bit (and their .dtype variants): one template over the bit width.
//
//   out[i, j] = to_out((float(q[idx[i], j]) - zp[r, j / gs]) * scale[r, j / gs])     r = idx[i]
//
// in float32, each step its own operation (nothing to contract into an FMA: a subtraction then a
// product), rounded once to the output dtype (float32, float16 or bfloat16, round
// half to even). q is read from
//   8 bits  an int8 or uint8 [N, D] table (any strides);
//   4 bits  a packed uint8 [N, D / 2] table, element 2k in the high nibble of byte k, value = nibble - 8;
//   2 bits  a packed uint8 [N, D / 4] table, element 4k + t in bits 2t..2t+1 of byte k, value = field - 2
// (executorch's `quant_fusion::_pack_embedding_weight` layout). Scales and zero points are [N] /
// [N, 1] (per row) or [N, G] (groups of gs = D / G columns), read in their own dtype.
// etfuse::embedding_{byte,4bit,2bit}_int8_zp (Args::int8_difference): int8 zero points, q - zp
// taken to int8 (wrapping) before the product, as torch's int8 subtraction in
// dequantize_per_channel_group does. A packed group whose zero point keeps every q - zp inside int8
// takes the plain loops (the same bits).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#define ETFUSE_EMB_AVX2 __attribute__((target("avx2")))
#endif

namespace etfuse {
namespace core {
namespace embedding {

// The dtypes a scale / zero-point table may have, and the output dtypes.
enum class VType { kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64 };
enum class OType { kF32, kF16, kBF16 };

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: man * 2^-24, exact in float
    float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half bits, round to nearest even (torch's .to(float16)).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // below the smallest normal half: a multiple of 2^-24
    float af;
    std::memcpy(&af, &ax, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::rint(af * 16777216.0f)));
  }
  ax += 0xfffu + ((ax >> 13) & 1u);
  ax -= 112u << 23;
  return static_cast<uint16_t>(sign | (ax >> 13));
}

// float -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN (torch's .to(bfloat16)).
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// A [N] or [N, G] table of per-row / per-group values, read as float.
struct Table {
  const void* data = nullptr;  // null: no table (zero points absent)
  VType type = VType::kF32;
  int64_t s0 = 0, s1 = 0;  // element strides of the row and the group (s1 unused when G == 1)

  float at(int64_t r, int64_t g) const {
    const int64_t k = r * s0 + g * s1;
    switch (type) {
      case VType::kF32: return static_cast<const float*>(data)[k];
      case VType::kF16: return half_bits_to_float(static_cast<const uint16_t*>(data)[k]);
      case VType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(data)[k]);
      case VType::kF64: return static_cast<float>(static_cast<const double*>(data)[k]);
      case VType::kI8: return static_cast<float>(static_cast<const int8_t*>(data)[k]);
      case VType::kU8: return static_cast<float>(static_cast<const uint8_t*>(data)[k]);
      case VType::kI16: return static_cast<float>(static_cast<const int16_t*>(data)[k]);
      case VType::kI32: return static_cast<float>(static_cast<const int32_t*>(data)[k]);
      case VType::kI64: return static_cast<float>(static_cast<const int64_t*>(data)[k]);
    }
    return 0.0f;
  }
};

struct Args {
  int bits = 8;  // 8, 4 or 2
  const void* weight = nullptr;  // see the top of this file
  bool int8_weight = true;  // 8 bits: int8 (else uint8); packed tables are uint8
  bool int8_difference = false;  // int8 zero points (8 bits: int8 values too): q - zp wraps to int8
  int64_t rows = 0, dim = 0;  // N and the unpacked D
  int64_t w_stride0 = 0, w_stride1 = 1;  // element strides; packed tables need w_stride1 == 1
  int64_t groups = 1;  // G: dim % groups == 0
  Table scales, zero_points;
  const int64_t* indices = nullptr;  // flattened, int64 (converted by the caller if needed)
  int64_t num_indices = 0;
  void* out = nullptr;  // [num_indices, D] contiguous
  OType otype = OType::kF32;
};

// The first out-of-range index, or -1 when all are inside [0, rows).
inline int64_t bad_index(const int64_t* idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= rows) return i;
  }
  return -1;
}

template <int Bits>
struct Unpack;

template <>
struct Unpack<4> {
  static ETFUSE_ALWAYS_INLINE int value(const uint8_t* w, int64_t j) {
    const uint8_t b = w[j >> 1];
    return static_cast<int>((j & 1) ? (b & 0x0f) : (b >> 4)) - 8;
  }
};

template <>
struct Unpack<2> {
  static ETFUSE_ALWAYS_INLINE int value(const uint8_t* w, int64_t j) {
    return static_cast<int>((w[j >> 2] >> (2 * (j & 3))) & 3) - 2;
  }
};

struct F32Out {
  using T = float;
  static ETFUSE_ALWAYS_INLINE void store(float* o, float v) { *o = v; }
};
struct F16Out {
  using T = uint16_t;
  static ETFUSE_ALWAYS_INLINE void store(uint16_t* o, float v) { *o = float_to_half_bits(v); }
};
struct BF16Out {
  using T = uint16_t;
  static ETFUSE_ALWAYS_INLINE void store(uint16_t* o, float v) { *o = float_to_bf16_bits(v); }
};

// Columns [j0, j1) of one row, one (zero point, scale) pair: scalar loops the compiler
// vectorises where it can (the 8-bit unit-stride case), used for every width and ISA.
template <int Bits, class O, class TW>
struct Span {
  static ETFUSE_ALWAYS_INLINE void run(const TW* w, int64_t ws, int64_t j0, int64_t j1, float z, float s,
                                       typename O::T* o) {
    if constexpr (Bits == 8) {
      if (ws == 1) {
        for (int64_t j = j0; j < j1; ++j) O::store(o + j, (static_cast<float>(w[j]) - z) * s);
      } else {
        for (int64_t j = j0; j < j1; ++j) O::store(o + j, (static_cast<float>(w[j * ws]) - z) * s);
      }
    } else {
      for (int64_t j = j0; j < j1; ++j) O::store(o + j, (static_cast<float>(Unpack<Bits>::value(w, j)) - z) * s);
    }
  }
};

// Columns [j0, j1) of a row whose difference with the int8 zero point z is taken to int8.
template <int Bits, class O, class TW>
struct Int8DifferenceSpan {
  static ETFUSE_ALWAYS_INLINE void run(const TW* w, int64_t ws, int64_t j0, int64_t j1, int8_t z, float s,
                                       typename O::T* o) {
    for (int64_t j = j0; j < j1; ++j) {
      int q;
      if constexpr (Bits == 8) {
        q = w[j * ws];
      } else {
        q = Unpack<Bits>::value(reinterpret_cast<const uint8_t*>(w), j);
      }
      // modulo 256 in uint8 (defined), then read back as int8
      const int8_t d = static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint8_t>(q) - static_cast<uint8_t>(z)));
      O::store(o + j, static_cast<float>(d) * s);
    }
  }
};

#if ETFUSE_HAVE_X86_DISPATCH
// 4 bits, float32 out, AVX2: 16 columns (8 bytes) a step from an even column; the rest scalar.
ETFUSE_EMB_AVX2 inline int64_t span4_f32_avx2(const uint8_t* w, int64_t j0, int64_t j1, float z, float s,
                                              float* o) {
  const __m128i lo_mask = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256 vz = _mm256_set1_ps(z), vs = _mm256_set1_ps(s);
  int64_t j = j0;
  for (; j + 16 <= j1; j += 16) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + (j >> 1)));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), lo_mask);
    const __m128i lo = _mm_and_si128(b, lo_mask);
    const __m128i v = _mm_unpacklo_epi8(hi, lo);  // hi0 lo0 hi1 lo1 ...: column order
    const __m256i a = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight);
    const __m256i c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)), eight);
    _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(a), vz), vs));
    _mm256_storeu_ps(o + j + 8, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(c), vz), vs));
  }
  return j;
}
#endif

template <int Bits, class O, class TW>
struct Rows {
  // Output rows [i0, i1).
  static ETFUSE_ALWAYS_INLINE void run(const Args& e, int64_t i0, int64_t i1, bool avx2) {
    (void)avx2;
    const TW* w = static_cast<const TW*>(e.weight);
    typename O::T* out = static_cast<typename O::T*>(e.out);
    const int64_t gs = e.groups > 0 ? e.dim / e.groups : e.dim;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = e.indices[i];
      const TW* wr = w + r * e.w_stride0;
      typename O::T* o = out + i * e.dim;
      for (int64_t g = 0; g < e.groups; ++g) {
        const float s = e.scales.at(r, g);
        const float z = e.zero_points.data ? e.zero_points.at(r, g) : 0.0f;
        int64_t j = g * gs;
        const int64_t end = j + gs;
        if constexpr (Bits < 8 || std::is_same<TW, int8_t>::value) {
          // z holds an int8 value exactly; packed values lie in [lo, hi], so q - z stays in int8
          // for z in [hi - 127, lo + 128] (every z at 8 bits may wrap)
          constexpr int lo = -(1 << (Bits - 1)), hi = (1 << (Bits - 1)) - 1;
          if (e.int8_difference && (Bits == 8 || z < hi - 127 || z > lo + 128)) {
            Int8DifferenceSpan<Bits, O, TW>::run(wr, e.w_stride1, j, end, static_cast<int8_t>(z), s, o);
            continue;
          }
        }
#if ETFUSE_HAVE_X86_DISPATCH
        if constexpr (Bits == 4 && std::is_same<O, F32Out>::value) {
          if (avx2 && (j & 1) == 0) j = span4_f32_avx2(reinterpret_cast<const uint8_t*>(wr), j, end, z, s, o);
        }
#endif
        Span<Bits, O, TW>::run(wr, e.w_stride1, j, end, z, s, o);
      }
    }
  }
};

#if ETFUSE_HAVE_X86_DISPATCH
template <int Bits, class O, class TW>
ETFUSE_EMB_AVX2 void rows_avx2(const Args& e, int64_t i0, int64_t i1) {
  Rows<Bits, O, TW>::run(e, i0, i1, true);
}
#endif

template <int Bits, class O, class TW>
void rows_base(const Args& e, int64_t i0, int64_t i1) {
  Rows<Bits, O, TW>::run(e, i0, i1, false);
}

// The rows of one (bits, output, weight) case on one ISA: the one place they are chosen
// (aarch64 runs the portable loop).
template <int Bits, class O, class TW>
struct Kernels {
  void (*rows)(const Args&, int64_t, int64_t);
};

template <int Bits, class O, class TW>
inline Kernels<Bits, O, TW> kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&rows_avx2<Bits, O, TW>};
#endif
    default: return {&rows_base<Bits, O, TW>};
  }
}

template <int Bits, class O, class TW>
void rows(const Args& e, int64_t i0, int64_t i1) {
  kernels<Bits, O, TW>(selected_isa()).rows(e, i0, i1);
}

template <int Bits, class TW>
void rows_for_out(const Args& e, int64_t i0, int64_t i1) {
  switch (e.otype) {
    case OType::kF32: return rows<Bits, F32Out, TW>(e, i0, i1);
    case OType::kF16: return rows<Bits, F16Out, TW>(e, i0, i1);
    case OType::kBF16: return rows<Bits, BF16Out, TW>(e, i0, i1);
  }
}

// Indices must have been checked (bad_index), the table shapes by the caller.
template <class Par>
void embedding(const Args& e, Par&& par) {
  auto fn = [&](int64_t i0, int64_t i1) {
    if (e.bits == 4) {
      rows_for_out<4, uint8_t>(e, i0, i1);
    } else if (e.bits == 2) {
      rows_for_out<2, uint8_t>(e, i0, i1);
    } else if (e.int8_weight) {
      rows_for_out<8, int8_t>(e, i0, i1);
    } else {
      rows_for_out<8, uint8_t>(e, i0, i1);
    }
  };
  const int64_t d = e.dim > 0 ? e.dim : 1;
  if (e.num_indices * d <= kSerialElements || e.num_indices < 2) {
    fn(0, e.num_indices);
    return;
  }
  int64_t grain = kGrainSize / d;
  if (grain < 1) grain = 1;
  par(int64_t(0), e.num_indices, grain, fn);
}

// quant_fusion::_pack_embedding_weight: rows of int8 (or uint8) values v, [N, D] contiguous, into
// [N, D * bits / 8] bytes; byte arithmetic exactly as executorch's Python reference (values
// outside [-8, 7] / [-2, 1] spill into the neighbours' bits there too).
inline void pack(const uint8_t* v, int64_t n, int64_t d, int bits, uint8_t* out) {
  if (bits == 4) {
    for (int64_t k = 0; k < n * d / 2; ++k) {
      out[k] = static_cast<uint8_t>(static_cast<uint8_t>(v[2 * k] + 8) << 4) | static_cast<uint8_t>(v[2 * k + 1] + 8);
    }
  } else {
    for (int64_t k = 0; k < n * d / 4; ++k) {
      uint8_t b = 0;
      for (int t = 0; t < 4; ++t) b |= static_cast<uint8_t>(static_cast<uint8_t>(v[4 * k + t] + 2) << (2 * t));
      out[k] = b;
    }
  }
}

}  // namespace embedding
}  // namespace core
}  // namespace etfuse
