// NEON (aarch64) softmax exp for core/attention.h: s[j] = exp(s[j] - m) (0 where s[j] - m is
// below -87.3, e.g. -inf) and their sum, in one pass over the row (the portable code stores the
// row, then reads it back to sum it), with activation_neon.h's exp polynomial.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "arch/arm/activation_neon.h"
#include "core/common.h"

namespace etfuse {
namespace core {
namespace attention {
namespace arm {

ETFUSE_ALWAYS_INLINE float32x4_t exp_or_zero(float32x4_t x) {
  const uint32x4_t hidden = vcltq_f32(x, vdupq_n_f32(-87.3f));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(activation::arm::exp_poly(x)), hidden));
}

inline float exp_row(float* s, int64_t n, float m) {
  const float32x4_t mv = vdupq_n_f32(m);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const float32x4_t a = exp_or_zero(vsubq_f32(vld1q_f32(s + j), mv));
    const float32x4_t b = exp_or_zero(vsubq_f32(vld1q_f32(s + j + 4), mv));
    vst1q_f32(s + j, a);
    vst1q_f32(s + j + 4, b);
    acc0 = vaddq_f32(acc0, a);
    acc1 = vaddq_f32(acc1, b);
  }
  if (j + 4 <= n) {
    const float32x4_t a = exp_or_zero(vsubq_f32(vld1q_f32(s + j), mv));
    vst1q_f32(s + j, a);
    acc0 = vaddq_f32(acc0, a);
    j += 4;
  }
  float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
  if (j < n) {
    // -inf pads the last vector: exp 0, nothing added
    float buf[4] = {-__builtin_inff(), -__builtin_inff(), -__builtin_inff(), -__builtin_inff()};
    for (int64_t t = j; t < n; ++t) buf[t - j] = s[t];
    const float32x4_t a = exp_or_zero(vsubq_f32(vld1q_f32(buf), mv));
    vst1q_f32(buf, a);
    for (int64_t t = j; t < n; ++t) s[t] = buf[t - j];
    sum += vaddvq_f32(a);
  }
  return sum;
}

}  // namespace arm
}  // namespace attention
}  // namespace core
}  // namespace etfuse
