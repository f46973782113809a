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

enum class Kind { kNone = 0, kSilu, kSigmoid, kGelu, kGeluTanh };

// The schema's `str activation` ("none", "silu", "sigmoid", "gelu", "gelu_tanh").
inline bool parse(const char* op, const char* s, size_t n, Kind& kind, Status& st) {
  struct Name {
    const char* name;
    Kind kind;
  };
  static const Name names[] = {{"none", Kind::kNone}, {"silu", Kind::kSilu}, {"sigmoid", Kind::kSigmoid},
                               {"gelu", Kind::kGelu}, {"gelu_tanh", Kind::kGeluTanh}};
  for (const Name& e : names) {
    if (std::strlen(e.name) == n && std::strncmp(e.name, s, n) == 0) {
      kind = e.kind;
      return true;
    }
  }
  return st.fail("%s: unknown activation '%.*s' (none, silu, sigmoid, gelu, gelu_tanh)", op, (int)n, s);
}

namespace detail {

ETFUSE_ALWAYS_INLINE float exp_poly(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);  // keeps 2^n a normal float; NaN passes through
  const float fx = x * 1.44269504088896341f;
  const int n = static_cast<int>(fx + (fx >= 0.0f ? 0.5f : -0.5f));  // round half away from zero
  const float nf = static_cast<float>(n);
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

ETFUSE_ALWAYS_INLINE float apply_one(Kind kind, float v) {
  switch (kind) {
    case Kind::kSilu:
      return v * sigmoid(v);
    case Kind::kSigmoid:
      return sigmoid(v);
    case Kind::kGelu:
      return 0.5f * v * (1.0f + erf_approx(v * 0.70710678118654752f));
    case Kind::kGeluTanh: {
      const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (2.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f));  // 1 + tanh(u)
    }
    default:
      return v;
  }
}

// The loop for one activation, so each vectorises on its own.
template <Kind K>
ETFUSE_ALWAYS_INLINE void loop(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = apply_one(K, p[i]);
}

template <Kind K>
void range_baseline(float* p, int64_t n) {
  loop<K>(p, n);
}
template <Kind K>
ETFUSE_TARGET_AVX2 void range_avx2(float* p, int64_t n) {
  loop<K>(p, n);
}

template <Kind K>
inline void range(float* p, int64_t n) {
  if (selected_isa() == Isa::kAvx2) {
    range_avx2<K>(p, n);
  } else {
    range_baseline<K>(p, n);
  }
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

}  // namespace activation
}  // namespace core
}  // namespace etfuse
