// Activations after a GEMM / convolution that are not a clamp: SiLU, sigmoid, GELU (erf and tanh).
//
// The GEMM's own epilogue does bias, scale and clamp while the tile is in registers; these run
// right after the op, over its output while it is still in cache, as one vectorised pass (the
// stock runtime runs each as one or two separate scalar ops). exp is a branch-free Cephes-style
// polynomial (about 2 ulp) that the compiler vectorises; erf is Abramowitz & Stegun 7.1.26
// (absolute error below 1.5e-7). NaN propagates.
#pragma once

#include <algorithm>
#include <cstring>

#include "common.h"

namespace etfuse {
namespace core {
namespace activation {

enum class Kind { kNone = 0, kSilu, kSigmoid, kGelu, kGeluTanh, kHardswish, kHardsigmoid };

// A name's activation in a table of (name, kind): whether it is there.
struct Named {
  const char* name;
  Kind kind;
};
template <size_t N>
inline bool lookup(const Named (&names)[N], const char* s, size_t n, Kind& kind) {
  for (const Named& e : names) {
    if (std::strlen(e.name) == n && std::strncmp(e.name, s, n) == 0) {
      kind = e.kind;
      return true;
    }
  }
  return false;
}

// The schema's `str activation` ("none", "silu", "sigmoid", "gelu", "gelu_tanh", "hardswish", "hardsigmoid").
inline bool parse(const char* op, const char* s, size_t n, Kind& kind, Status& st) {
  static const Named names[] = {{"none", Kind::kNone}, {"silu", Kind::kSilu}, {"sigmoid", Kind::kSigmoid},
                                {"gelu", Kind::kGelu}, {"gelu_tanh", Kind::kGeluTanh},
                                {"hardswish", Kind::kHardswish}, {"hardsigmoid", Kind::kHardsigmoid}};
  if (lookup(names, s, n, kind)) return true;
  return st.fail("%s: unknown activation '%.*s' (none, silu, sigmoid, gelu, gelu_tanh, hardswish, hardsigmoid)", op, (int)n, s);
}

// A gated activation of a linear ("swiglu", "geglu", "geglu_tanh"): `inner` of the first half of
// the output features times the second half (apply_gated). False for any other name.
inline bool parse_gated(const char* s, size_t n, Kind& inner) {
  static const Named names[] = {{"swiglu", Kind::kSilu}, {"geglu", Kind::kGelu}, {"geglu_tanh", Kind::kGeluTanh}};
  return lookup(names, s, n, inner);
}

namespace detail {

ETFUSE_ALWAYS_INLINE float exp_poly(float x) {
  x = x < -87.3f ? -87.3f : x;  // keeps 2^n a normal float; NaN passes through
  x = x > 88.7f ? 88.7f : x;
  // n = round(x / ln2) without a conversion instruction: adding 1.5 * 2^23 rounds to an integer
  // in the float's low mantissa bits, which are n's two's complement
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float nf = t - 12582912.0f;
  int tb;
  std::memcpy(&tb, &t, sizeof(tb));
  const int n = tb - 0x4B400000;
  const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;  // x - n ln2, in two parts
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const int bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

ETFUSE_ALWAYS_INLINE float sigmoid(float x) {
  return 1.0f / (1.0f + exp_poly(-x));
}

ETFUSE_ALWAYS_INLINE float erf_approx(float x) {
  const float a = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float e = 1.0f - p * t * exp_poly(-a * a);
  return x < 0.0f ? -e : e;
}

// clamp(v + 3, 0, 6), NaN kept (as torch.clamp)
ETFUSE_ALWAYS_INLINE float hard_gate(float v) {
  const float t = v + 3.0f;
  return t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
}

template <Kind K>
ETFUSE_ALWAYS_INLINE float apply(float v) {
  if constexpr (K == Kind::kSilu) {
    return v * sigmoid(v);
  } else if constexpr (K == Kind::kSigmoid) {
    return sigmoid(v);
  } else if constexpr (K == Kind::kGelu) {
    return 0.5f * v * (1.0f + erf_approx(v * 0.70710678118654752f));
  } else if constexpr (K == Kind::kGeluTanh) {
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (2.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f));  // 1 + tanh(u)
  } else if constexpr (K == Kind::kHardswish) {
    return v * hard_gate(v) / 6.0f;  // torch's order: x * clamp(x + 3, 0, 6) / 6
  } else if constexpr (K == Kind::kHardsigmoid) {
    return hard_gate(v) / 6.0f;
  } else {
    return v;
  }
}

inline float apply_one(Kind kind, float v) {
  switch (kind) {
    case Kind::kSilu:
      return apply<Kind::kSilu>(v);
    case Kind::kSigmoid:
      return apply<Kind::kSigmoid>(v);
    case Kind::kGelu:
      return apply<Kind::kGelu>(v);
    case Kind::kGeluTanh:
      return apply<Kind::kGeluTanh>(v);
    case Kind::kHardswish:
      return apply<Kind::kHardswish>(v);
    case Kind::kHardsigmoid:
      return apply<Kind::kHardsigmoid>(v);
    default:
      return v;
  }
}

// The selects above (clamps, signs) are comparisons, which may raise FP exception flags: GCC
// only turns them into vector blends without -ftrapping-math. Nobody reads those flags here.
#if defined(__GNUC__) && !defined(__clang__)
#define ETFUSE_NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math")))
#else
#define ETFUSE_NO_TRAPPING_MATH
#endif

// One loop per activation and ISA, so each vectorises on its own.
template <Kind K>
ETFUSE_NO_TRAPPING_MATH void range_baseline(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = apply<K>(p[i]);
}
#if ETFUSE_HAVE_X86_DISPATCH
template <Kind K>
ETFUSE_TARGET_AVX2 ETFUSE_NO_TRAPPING_MATH void range_avx2(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = apply<K>(p[i]);
}
#endif

}  // namespace detail
}  // namespace activation
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/activation_neon.h"
#endif

namespace etfuse {
namespace core {
namespace activation {
namespace detail {

// An activation's kernel on one ISA: the one place it is chosen (AVX-512 takes the AVX2 loop:
// the pass is bound by memory).
template <Kind K>
struct Kernels {
  void (*range)(float*, int64_t);
};

template <Kind K>
inline Kernels<K> kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&range_avx2<K>};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {&arm::range<K>};
#endif
    default: return {&range_baseline<K>};
  }
}

template <Kind K>
inline void range(float* p, int64_t n) {
  kernels<K>(selected_isa()).range(p, n);
}

inline void dispatch(Kind kind, float* p, int64_t n) {
  switch (kind) {
    case Kind::kSilu:
      return range<Kind::kSilu>(p, n);
    case Kind::kSigmoid:
      return range<Kind::kSigmoid>(p, n);
    case Kind::kGelu:
      return range<Kind::kGelu>(p, n);
    case Kind::kGeluTanh:
      return range<Kind::kGeluTanh>(p, n);
    case Kind::kHardswish:
      return range<Kind::kHardswish>(p, n);
    case Kind::kHardsigmoid:
      return range<Kind::kHardsigmoid>(p, n);
    default:
      return;
  }
}

}  // namespace detail

// The activation over every element of a tensor written with layout `l` at `data` (an op's
// output: no element twice). A layout that covers its span without gaps (contiguous, or any
// permutation of it such as channels-last) is one flat range; anything else goes element by element.
template <class Par>
inline void apply(Kind kind, float* data, const Layout& l, Par&& par) {
  if (kind == Kind::kNone) return;
  const int64_t n = l.numel();
  if (n == 0) return;
  int64_t span = 1;
  bool positive = true;
  for (int d = 0; d < l.ndim; ++d) {
    positive = positive && l.strides[d] >= 0;
    span += (l.sizes[d] - 1) * l.strides[d];
  }
  if (positive && span == n) {
    for_elements(n, par, [&](int64_t b, int64_t e) { detail::dispatch(kind, data + b, e - b); });
    return;
  }
  int64_t idx[kMaxDims] = {0};
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    data[off] = detail::apply_one(kind, data[off]);
    for (int d = l.ndim - 1; d >= 0; --d) {
      off += l.strides[d];
      if (++idx[d] < l.sizes[d]) break;
      off -= l.strides[d] * l.sizes[d];
      idx[d] = 0;
    }
  }
}

// A gated activation: out[r, j] = act(y[r, j]) * y[r, h + j] for y [rows, 2h] (contiguous), out's
// rows at out_rs and columns at out_cs. A row's run of columns is copied, activated in place
// (the vectorised loop above) and multiplied, where out's columns are contiguous.
template <class Par>
inline void apply_gated(Kind kind, const float* y, int64_t rows, int64_t h, float* out, int64_t out_rs,
                        int64_t out_cs, Par&& par) {
  if (rows * h == 0) return;
  for_elements(rows * h, par, [&](int64_t b, int64_t e) {
    while (b < e) {
      const int64_t r = b / h, j0 = b % h, j1 = (e - r * h) < h ? (e - r * h) : h;
      const float* a = y + r * 2 * h;
      float* o = out + r * out_rs;
      if (out_cs == 1) {
        std::memcpy(o + j0, a + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
        detail::dispatch(kind, o + j0, j1 - j0);
        for (int64_t j = j0; j < j1; ++j) o[j] *= a[h + j];
      } else {
        for (int64_t j = j0; j < j1; ++j) o[j * out_cs] = detail::apply_one(kind, a[j]) * a[h + j];
      }
      b = r * h + j1;
    }
  });
}

}  // namespace activation
}  // namespace core
}  // namespace etfuse
