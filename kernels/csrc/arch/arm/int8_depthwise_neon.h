// The int8 depthwise conv (core/int8_depthwise.h's Problem: one input channel per output
// channel, stride 1 or 2, dilation 1, any kernel size and padding) on aarch64 NEON, in integers:
//   acc[c, p] = sum_k (w[c, k] - w_zp[c]) * (x[c, tap k of p] - x_zp)     exact, in int32
// then requantized by int8_neon.h's requant_store8 (requant_loop's float steps in order,
// contraction off), so the result is bit-exact with the float path and the x86 kernel (whose
// float sums are the same integers).
//
// Plane by plane: a plane is converted once to int16 (x - x_zp, in [-255, 255]) into a
// zero-padded buffer of the thread (the padding is x_zp, so 0 there); an output row is then 8
// outputs a vector, each tap one load (stride 2: vld2q, whose two halves are the taps kw and
// kw + 1) and smlal / smlal2 by the tap's int16 weight (w - w_zp, |w - w_zp| <= 383: products
// below 2^17, sums exact in int32). 3x3 and 5x5 have their weights in registers (the shapes of
// MobileNetV2 and the like); other sizes loop over the taps.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/common.h"
#include "core/int8_pointwise.h"  // arch/arm/int8_neon.h: the epilogue (requant_store8)

namespace etfuse {
namespace core {
namespace int8_depthwise {
namespace arm {

namespace detail {

// Planes [t0, t1) (plane t: image t / C, channel t % C). Compiled once per library in
// core/kernels.cpp.
ETFUSE_NEON_NOCONTRACT void planes(const Problem& pb, int64_t t0, int64_t t1);

#if defined(ETFUSE_CORE_KERNELS)
namespace ep = int8_pointwise::arm::detail;

// One input row of W bytes -> W int16 (x - x_zp) at dst. Vectors of 8, the last one ending at W
// (it rewrites some of the one before with the same values); narrower rows one by one.
template <bool Signed>
ETFUSE_ALWAYS_INLINE void convert_row(const uint8_t* src, int64_t W, int16x8_t zp, int16_t* dst) {
  if (W < 8) {
    const int16_t z = vgetq_lane_s16(zp, 0);
    for (int64_t j = 0; j < W; ++j) {
      dst[j] = static_cast<int16_t>((Signed ? static_cast<int16_t>(static_cast<int8_t>(src[j])) : src[j]) - z);
    }
    return;
  }
  for (int64_t j = 0;; j += 8) {
    if (j > W - 8) j = W - 8;
    const uint8x8_t b = vld1_u8(src + j);
    const int16x8_t v = Signed ? vmovl_s8(vreinterpret_s8_u8(b)) : vreinterpretq_s16_u16(vmovl_u8(b));
    vst1q_s16(dst + j, vsubq_s16(v, zp));
    if (j == W - 8) break;
  }
}

// One plane of bytes into the buffer (row r of the padded input at r * pitch).
template <bool Signed>
ETFUSE_ALWAYS_INLINE void fill_plane(const Problem& pb, const uint8_t* x, int16x8_t zp, int64_t pitch, int16_t* buf) {
  int16_t* row = buf + pb.padding[0] * pitch + pb.padding[1];
  for (int64_t ih = 0; ih < pb.H; ++ih, x += pb.W, row += pitch) convert_row<Signed>(x, pb.W, zp, row);
}

#define ETFUSE_DW_MAC(xv, wk)                     \
  do {                                            \
    const int16x8_t v_ = (xv);                    \
    const int16_t w_ = (wk);                      \
    a0 = vmlal_n_s16(a0, vget_low_s16(v_), w_);   \
    a1 = vmlal_high_n_s16(a1, v_, w_);            \
  } while (0)

// All output rows of one plane of channel c. KH_, KW_: the kernel size, or 0: pb's (a loop over
// the taps); S: the stride. `wk`: the plane's int16 weights [KH][KW].
template <int KH_, int KW_, int S>
ETFUSE_NEON_NOCONTRACT ETFUSE_ALWAYS_INLINE void plane(const Problem& pb, const ep::RequantNeon& e, int64_t c,
                                                       const int16_t* buf, int64_t pitch, const int16_t* wk,
                                                       uint8_t* out) {
  constexpr bool kFixed = KH_ > 0;
  const int KH = kFixed ? KH_ : static_cast<int>(pb.KH), KW = kFixed ? KW_ : static_cast<int>(pb.KW);
  // fixed sizes: the weights in locals (registers), out of reach of the byte stores' aliasing
  int16_t wl[kFixed ? KH_ * KW_ : 1];
  if (kFixed) {
    for (int k = 0; k < KH_ * KW_; ++k) wl[k] = wk[k];
  }
  const int16_t* w = kFixed ? wl : wk;
  // the channel's scale and bias in locals too: requant_store8 reads them through `rq` (as
  // channel 0), kept in registers instead of reloaded after every store
  const float scale = pb.requant.scale[c], bias = pb.requant.bias ? pb.requant.bias[c] : 0.0f;
  int8_epilogue::Requant rq = pb.requant;
  rq.scale = &scale;
  rq.bias = pb.requant.bias ? &bias : nullptr;
  const int64_t OW = pb.OW;
  for (int64_t oh = 0; oh < pb.OH; ++oh, out += OW) {
    const int16_t* rows = buf + oh * S * pitch;
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 8) {
      int32x4_t a0 = vdupq_n_s32(0), a1 = vdupq_n_s32(0);
      const int16_t* r = rows + S * ow0;
#pragma GCC unroll 5
      for (int kh = 0; kh < KH; ++kh, r += pitch) {
        const int16_t* wr = w + kh * KW;
        if (S == 1) {
#pragma GCC unroll 5
          for (int kw = 0; kw < KW; ++kw) ETFUSE_DW_MAC(vld1q_s16(r + kw), wr[kw]);
        } else {
          // taps kw and kw + 1 of 8 outputs: the even and odd elements from r + kw
#pragma GCC unroll 3
          for (int kw = 0; kw < KW; kw += 2) {
            const int16x8x2_t d = vld2q_s16(r + kw);
            ETFUSE_DW_MAC(d.val[0], wr[kw]);
            if (kw + 1 < KW) ETFUSE_DW_MAC(d.val[1], wr[kw + 1]);
          }
        }
      }
      ep::requant_store8(rq, e, 0, a0, a1, OW - ow0, out + ow0);
    }
  }
}
#undef ETFUSE_DW_MAC

ETFUSE_NEON_NOCONTRACT void planes(const Problem& pb, int64_t t0, int64_t t1) {
  const int64_t s = pb.stride[0], taps = pb.KH * pb.KW, HW = pb.H * pb.W, P = pb.OH * pb.OW;
  const int64_t OW8 = (pb.OW + 7) / 8 * 8, Hp = pb.H + 2 * pb.padding[0], Wp = pb.W + 2 * pb.padding[1];
  // a row of the buffer: holds the padded row, and every tap of the last vector reads inside it
  // (stride 1: up to OW8 + KW - 2; stride 2, 16 elements from 2 (OW8 - 8) + kw: up to 2 OW8 + KW - 2)
  const int64_t pitch = (std::max(Wp, s * OW8 + pb.KW) + 7) / 8 * 8;
  thread_local std::vector<int16_t> buf, wk;
  buf.assign(static_cast<size_t>(Hp * pitch), 0);  // the padding stays 0: only interiors are written
  wk.resize(std::max(wk.size(), static_cast<size_t>(taps)));
  const int16x8_t zp = vdupq_n_s16(static_cast<int16_t>(pb.x_zero_point));  // integral in [-128, 255]
  const ep::RequantNeon e = core::arm::requant_neon(pb.requant);
  const int kind = pb.KH == 3 && pb.KW == 3 ? 1 : pb.KH == 5 && pb.KW == 5 ? 2 : 0;
  int64_t c = t0 % pb.C;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t zw = pb.w_zp ? static_cast<int64_t>(pb.w_zp[c]) : 0;  // integral (takes_weight_zero_points)
    const int8_t* wq = pb.wq + c * taps;
    for (int64_t k = 0; k < taps; ++k) wk[k] = static_cast<int16_t>(wq[k] - zw);
    if (pb.x_signed) {
      fill_plane<true>(pb, pb.x + t * HW, zp, pitch, buf.data());
    } else {
      fill_plane<false>(pb, pb.x + t * HW, zp, pitch, buf.data());
    }
    uint8_t* out = pb.out + t * P;
    const int16_t* b = buf.data();
    if (s == 1) {
      if (kind == 1) plane<3, 3, 1>(pb, e, c, b, pitch, wk.data(), out);
      else if (kind == 2) plane<5, 5, 1>(pb, e, c, b, pitch, wk.data(), out);
      else plane<0, 0, 1>(pb, e, c, b, pitch, wk.data(), out);
    } else {
      if (kind == 1) plane<3, 3, 2>(pb, e, c, b, pitch, wk.data(), out);
      else if (kind == 2) plane<5, 5, 2>(pb, e, c, b, pitch, wk.data(), out);
      else plane<0, 0, 2>(pb, e, c, b, pitch, wk.data(), out);
    }
    if (++c == pb.C) c = 0;
  }
}
#endif  // ETFUSE_CORE_KERNELS

}  // namespace detail

// The whole conv; `par` a parallel_for over planes.
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  const int64_t planes = pb.N * pb.C;
  if (planes == 0 || pb.OH == 0 || pb.OW == 0) return;
  // in the float GEMM's multiply-adds (kParallelMinMacs): 8 outputs a vector, a tap 2 smlal and
  // a load, the epilogue about 16 a vector, the conversion about 1 an input
  const int64_t per_plane = pb.OH * ((pb.OW + 7) / 8) * (3 * pb.KH * pb.KW + 16) + pb.H * pb.W;
  SerialBelow<Par>{par, planes * per_plane < kParallelMinMacs}(
      int64_t(0), planes, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, per_plane)),
      [&](int64_t b, int64_t e) { detail::planes(pb, b, e); });
}

}  // namespace arm
}  // namespace int8_depthwise
}  // namespace core
}  // namespace etfuse
