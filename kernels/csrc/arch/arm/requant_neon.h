// The int8 ops' requantizing epilogue on NEON, 8 values at a time, bit-exact with requant_loop
// (core/int8_gemm.h): the float steps in its order (the caller compiles them without FMA
// contraction), then rint(v) + zp and the clamp in integers, which is exact: fcvtns rounds half
// to even like rint, and where |rint(v)| passes int16 (saturated) both sides clamp to lo or hi.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "core/common.h"
#include "core/int8_epilogue.h"

namespace etfuse {
namespace core {
namespace arm {

// A Requant's per-call constants in registers.
struct RequantNeon {
  float32x4_t inv;
  int16x8_t zp, lo, hi;  // integral in the float path: exact as int16
};

ETFUSE_ALWAYS_INLINE RequantNeon requant_neon(const int8_epilogue::Requant& r) {
  return RequantNeon{vdupq_n_f32(r.inv), vdupq_n_s16(static_cast<int16_t>(r.zp)),
                     vdupq_n_s16(static_cast<int16_t>(r.lo)), vdupq_n_s16(static_cast<int16_t>(r.hi))};
}

// How the epilogue clamps: to [lo, hi] (kClamp), or, where [lo, hi] is the whole int8 / uint8
// range (no activation, or a relu6 whose range the quantizer fitted to it), by the saturating
// narrow to bytes alone (kInt8, kUint8): the same bytes, two instructions fewer per 8.
enum class Range { kClamp, kInt8, kUint8 };

ETFUSE_ALWAYS_INLINE Range range_of(const int8_epilogue::Requant& r, bool is_signed) {
  if (is_signed && r.lo == -128.0f && r.hi == 127.0f) return Range::kInt8;
  if (!is_signed && r.lo == 0.0f && r.hi == 255.0f) return Range::kUint8;
  return Range::kClamp;
}

// y = acc * scale + bias of 8 values -> their 8 bytes (the low byte of each: int8 or uint8).
template <Range R = Range::kClamp>
ETFUSE_ALWAYS_INLINE uint8x8_t requant8(const RequantNeon& e, float32x4_t y0, float32x4_t y1) {
  const int16x8_t q = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(y0, e.inv))),
                                   vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(y1, e.inv))));
  const int16x8_t v = vqaddq_s16(q, e.zp);
  if (R == Range::kInt8) return vreinterpret_u8_s8(vqmovn_s16(v));
  if (R == Range::kUint8) return vqmovun_s16(v);
  return vmovn_u16(vreinterpretq_u16_s16(vminq_s16(vmaxq_s16(v, e.lo), e.hi)));  // inside [-128, 255]
}

// The first m bytes of v at dst (all 8 from m = 8) by lane stores: a memcpy of a variable length
// is a library call, around which the caller's vector registers are spilled.
ETFUSE_ALWAYS_INLINE void store_bytes(uint8_t* dst, uint8x8_t v, int64_t m) {
  if (m >= 8) {
    vst1_u8(dst, v);
    return;
  }
  if (m & 4) {
    vst1_lane_u32(reinterpret_cast<uint32_t*>(dst), vreinterpret_u32_u8(v), 0);
    v = vext_u8(v, v, 4);
    dst += 4;
  }
  if (m & 2) {
    vst1_lane_u16(reinterpret_cast<uint16_t*>(dst), vreinterpret_u16_u8(v), 0);
    v = vext_u8(v, v, 2);
    dst += 2;
  }
  if (m & 1) vst1_lane_u8(dst, v, 0);
}

}  // namespace arm
}  // namespace core
}  // namespace etfuse
