// NEON (aarch64) forms of core/activation.h's element functions, four floats per instruction:
// the same exp polynomial, erf (Abramowitz & Stegun 7.1.26) and clamps, so aarch64 and x86
// agree to rounding. Written out because GCC's vectorisation of the portable loop keeps the
// scalar selects' NaN handling as compare / and / orn / bsl chains; NEON's fmax / fmin already
// propagate NaN as those selects do. Included by core/activation.h (Kind) on aarch64.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "core/common.h"

namespace etfuse {
namespace core {
namespace activation {
namespace arm {

// The factors come by lane from one register (fmla by element): the loops' 30-odd constants
// then fit in the registers instead of being reloaded each iteration. NonPositive: x <= 0 or
// NaN (no upper clamp).
template <bool NonPositive = false>
ETFUSE_ALWAYS_INLINE float32x4_t exp_poly(float32x4_t x) {
  const float32x4_t k = {1.44269504088896341f, 0.693359375f, 2.12194440e-4f, 1.9875691500e-4f};
  x = vmaxq_f32(x, vdupq_n_f32(-87.3f));  // fmax / fmin: NaN passes through
  if (!NonPositive) x = vminq_f32(x, vdupq_n_f32(88.7f));
  const float32x4_t magic = vdupq_n_f32(12582912.0f);  // 1.5 * 2^23: round to integer
  const float32x4_t t = vfmaq_laneq_f32(magic, x, k, 0);
  const float32x4_t nf = vsubq_f32(t, magic);
  float32x4_t r = vfmsq_laneq_f32(x, nf, k, 1);
  r = vfmaq_laneq_f32(r, nf, k, 2);
  const float32x4_t z = vmulq_f32(r, r);
  float32x4_t y = vfmaq_laneq_f32(vdupq_n_f32(1.3981999507e-3f), r, k, 3);
  y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
  y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
  y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
  y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
  y = vaddq_f32(vfmaq_f32(r, y, z), vdupq_n_f32(1.0f));
  // 2^n: t's low mantissa bits hold n; (n + 127) << 23 in one add and one shift
  const int32x4_t bits = vshlq_n_s32(vaddq_s32(vreinterpretq_s32_f32(t), vdupq_n_s32(127 - 0x4B400000)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(bits));
}

// 1 / (1 + exp(-x))
ETFUSE_ALWAYS_INLINE float32x4_t sigmoid(float32x4_t x) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  return vdivq_f32(one, vaddq_f32(one, exp_poly(vnegq_f32(x))));
}

ETFUSE_ALWAYS_INLINE float32x4_t erf_approx(float32x4_t x) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  const float32x4_t a = vabsq_f32(x);
  const float32x4_t k = {0.3275911f, 1.061405429f, 0.0f, 0.0f};
  const float32x4_t t = vdivq_f32(one, vfmaq_laneq_f32(one, a, k, 0));
  float32x4_t p = vfmaq_laneq_f32(vdupq_n_f32(-1.453152027f), t, k, 1);
  p = vfmaq_f32(vdupq_n_f32(1.421413741f), p, t);
  p = vfmaq_f32(vdupq_n_f32(-0.284496736f), p, t);
  p = vfmaq_f32(vdupq_n_f32(0.254829592f), p, t);
  const float32x4_t e = vfmsq_f32(one, vmulq_f32(p, t), exp_poly<true>(vmulq_f32(vnegq_f32(a), a)));
  // e >= 0: x's sign bit onto it
  const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
  return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(e), sign));
}

// clamp(v + 3, 0, 6), NaN kept
ETFUSE_ALWAYS_INLINE float32x4_t hard_gate(float32x4_t v) {
  const float32x4_t t = vaddq_f32(v, vdupq_n_f32(3.0f));
  return vminq_f32(vmaxq_f32(t, vdupq_n_f32(0.0f)), vdupq_n_f32(6.0f));
}

template <Kind K>
ETFUSE_ALWAYS_INLINE float32x4_t apply(float32x4_t v) {
  if constexpr (K == Kind::kSilu) {
    return vdivq_f32(v, vaddq_f32(vdupq_n_f32(1.0f), exp_poly(vnegq_f32(v))));  // v * sigmoid(v)
  } else if constexpr (K == Kind::kSigmoid) {
    return sigmoid(v);
  } else if constexpr (K == Kind::kGelu) {
    const float32x4_t k = {0.5f, 0.70710678118654752f, 0.0f, 0.0f};
    const float32x4_t h = vmulq_laneq_f32(v, k, 0);
    return vfmaq_f32(h, h, erf_approx(vmulq_laneq_f32(v, k, 1)));
  } else if constexpr (K == Kind::kGeluTanh) {
    // 0.5 v (2 - 2 / (exp(2u) + 1)), u = 0.79788 (v + 0.044715 v^3): the portable order, which
    // keeps gelu_tanh(inf) = inf (v - v / (exp(2u) + 1) would be inf - inf)
    const float32x4_t inner = vfmaq_f32(v, vmulq_f32(vmulq_f32(v, v), vdupq_n_f32(0.044715f)), v);
    const float32x4_t e = exp_poly(vmulq_f32(inner, vdupq_n_f32(2.0f * 0.7978845608028654f)));
    const float32x4_t two = vdupq_n_f32(2.0f);
    const float32x4_t g = vsubq_f32(two, vdivq_f32(two, vaddq_f32(e, vdupq_n_f32(1.0f))));
    return vmulq_f32(vmulq_f32(v, vdupq_n_f32(0.5f)), g);
  } else if constexpr (K == Kind::kHardswish) {
    return vdivq_f32(vmulq_f32(v, hard_gate(v)), vdupq_n_f32(6.0f));
  } else if constexpr (K == Kind::kHardsigmoid) {
    return vdivq_f32(hard_gate(v), vdupq_n_f32(6.0f));
  } else {
    return v;
  }
}

// p[0:n] = act(p[0:n]): two vectors per step (the polynomials' latency chains interleave), then
// one, and the last n % 4 through a padded vector (the same arithmetic as the rest). GELU one
// vector per step: two of its erf and exp need more than the 32 registers with its 17 constants
// (spills, constants reloaded by adrp + ldr each step: 12 instructions per 4 floats more).
template <Kind K>
inline void range(float* p, int64_t n) {
  int64_t i = 0;
  for (; K != Kind::kGelu && i + 8 <= n; i += 8) {
    const float32x4_t a = apply<K>(vld1q_f32(p + i)), b = apply<K>(vld1q_f32(p + i + 4));
    vst1q_f32(p + i, a);
    vst1q_f32(p + i + 4, b);
  }
  for (; i + 4 <= n; i += 4) vst1q_f32(p + i, apply<K>(vld1q_f32(p + i)));
  if (i < n) {
    float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    std::memcpy(buf, p + i, static_cast<size_t>(n - i) * sizeof(float));
    vst1q_f32(buf, apply<K>(vld1q_f32(buf)));
    std::memcpy(p + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace arm
}  // namespace activation
}  // namespace core
}  // namespace etfuse
