// NEON (aarch64) rows of core/norm.h's RMS and layer norms: the same passes and the same order
// of operations per element, 16 floats per loop step in four accumulators (the portable code's
// 4-wide vectors spend about as many instructions on the loop as on the arithmetic), and the
// output loop specialised on whether weight and bias are there.
#pragma once

#include <arm_neon.h>

#include <cmath>
#include <cstdint>

#include "core/common.h"

namespace etfuse {
namespace core {
namespace norm {
namespace arm {

// sum over j < n of x[j], or (Square) of (x[j] - c)^2 (x[j]^2 without HasC)
template <bool Square, bool HasC = Square>
ETFUSE_ALWAYS_INLINE float row_sum(const float* x, int64_t n, float c) {
  const float32x4_t cv = vdupq_n_f32(c);
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int u = 0; u < 4; ++u) {
      const float32x4_t v = vld1q_f32(x + j + 4 * u);
      if (Square) {
        const float32x4_t d = HasC ? vsubq_f32(v, cv) : v;
        acc[u] = vfmaq_f32(acc[u], d, d);
      } else {
        acc[u] = vaddq_f32(acc[u], v);
      }
    }
  }
  for (; j + 4 <= n; j += 4) {
    const float32x4_t v = vld1q_f32(x + j);
    if (Square) {
      const float32x4_t d = HasC ? vsubq_f32(v, cv) : v;
      acc[0] = vfmaq_f32(acc[0], d, d);
    } else {
      acc[0] = vaddq_f32(acc[0], v);
    }
  }
  float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; j < n; ++j) {
    const float d = HasC ? x[j] - c : x[j];
    sum += Square ? d * d : x[j];
  }
  return sum;
}

// o[j] = ((x[j] - c) * inv) * w[j] + b[j]: c, w and b where HasC / HasW / HasB
template <bool HasC, bool HasW, bool HasB>
ETFUSE_ALWAYS_INLINE void row_out(const float* x, int64_t n, float c, float inv, const float* w, const float* b,
                                  float* o) {
  const float32x4_t cv = vdupq_n_f32(c), iv = vdupq_n_f32(inv);
  const auto one = [&](int64_t j) {
    float32x4_t v = vld1q_f32(x + j);
    v = vmulq_f32(HasC ? vsubq_f32(v, cv) : v, iv);
    if (HasW) v = vmulq_f32(v, vld1q_f32(w + j));
    if (HasB) v = vaddq_f32(v, vld1q_f32(b + j));
    vst1q_f32(o + j, v);
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    one(j), one(j + 4), one(j + 8), one(j + 12);
  }
  for (; j + 4 <= n; j += 4) one(j);
  for (; j < n; ++j) {
    float v = (HasC ? x[j] - c : x[j]) * inv;
    if (HasW) v *= w[j];
    if (HasB) v += b[j];
    o[j] = v;
  }
}

template <bool HasC>
ETFUSE_ALWAYS_INLINE void row_out(const float* x, int64_t n, float c, float inv, const float* w, const float* b,
                                  float* o) {
  if (w && b) return row_out<HasC, true, true>(x, n, c, inv, w, b, o);
  if (w) return row_out<HasC, true, false>(x, n, c, inv, w, b, o);
  if (b) return row_out<HasC, false, true>(x, n, c, inv, w, b, o);
  row_out<HasC, false, false>(x, n, c, inv, w, b, o);
}

// RMS norm of one row: (x * rsqrt(mean(x^2) + eps)) * w
inline void rms_row(const float* x, int64_t n, const float* w, float eps, float* o) {
  const float inv = 1.0f / std::sqrt(row_sum<true, false>(x, n, 0.0f) / static_cast<float>(n) + eps);
  row_out<false>(x, n, 0.0f, inv, w, nullptr, o);
}

// layer norm of one row: (x - mean) * rsqrt(var + eps) * w + b, var from the squares of x - mean
inline void layer_row(const float* x, int64_t n, const float* w, const float* b, float eps, float* o) {
  const float mean = row_sum<false>(x, n, 0.0f) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(row_sum<true>(x, n, mean) / static_cast<float>(n) + eps);
  row_out<true>(x, n, mean, inv, w, b, o);
}

}  // namespace arm
}  // namespace norm
}  // namespace core
}  // namespace etfuse
