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
#include <cstring>
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
// Blocks of 8 channels [b0, b1) (block b: image b / B, channels from b % B * 8; B = C8 / 8).
ETFUSE_NEON_NOCONTRACT void channel_blocks(const Problem& pb, int64_t b0, int64_t b1);

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
// 8 rows of 8 bytes, given as q[j] = [row j | row j + 4] -> q[j] = [column 2j | column 2j + 1]
// (three rounds of zips).
ETFUSE_ALWAYS_INLINE void transpose8x8(uint8x16_t (&q)[4]) {
  const uint16x8_t a0 = vreinterpretq_u16_u8(vzip1q_u8(q[0], q[1])), a1 = vreinterpretq_u16_u8(vzip2q_u8(q[0], q[1]));
  const uint16x8_t a2 = vreinterpretq_u16_u8(vzip1q_u8(q[2], q[3])), a3 = vreinterpretq_u16_u8(vzip2q_u8(q[2], q[3]));
  // rows 0-3 of columns 0-3 and 4-7, then rows 4-7
  const uint32x4_t b0 = vreinterpretq_u32_u16(vzip1q_u16(a0, a2)), b1 = vreinterpretq_u32_u16(vzip2q_u16(a0, a2));
  const uint32x4_t b2 = vreinterpretq_u32_u16(vzip1q_u16(a1, a3)), b3 = vreinterpretq_u32_u16(vzip2q_u16(a1, a3));
  q[0] = vreinterpretq_u8_u32(vzip1q_u32(b0, b2));
  q[1] = vreinterpretq_u8_u32(vzip2q_u32(b0, b2));
  q[2] = vreinterpretq_u8_u32(vzip1q_u32(b1, b3));
  q[3] = vreinterpretq_u8_u32(vzip2q_u32(b1, b3));
}

// 8 rows of 8 bytes at row[j] + at, transposed.
ETFUSE_ALWAYS_INLINE void load_transposed(const uint8_t* const (&row)[8], int64_t at, uint8x16_t (&q)[4]) {
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) q[j] = vcombine_u8(vld1_u8(row[j] + at), vld1_u8(row[j + 4] + at));
  transpose8x8(q);
}

// Where the 8 rows of a block of nc (<= 8) start, `pitch` apart; rows past nc repeat row 0.
ETFUSE_ALWAYS_INLINE void block_rows(const uint8_t* first, int64_t pitch, int nc, const uint8_t* (&row)[8]) {
  for (int j = 0; j < 8; ++j) row[j] = first + (j < nc ? j : 0) * pitch;
}

// The block's P output pixels: the taps over xb + out_at[q] ([Hp][Wp][8]) -> 8 bytes at
// ob + 8 q. Taps: the count, or 0 (`taps`). Weights and offsets in locals: the byte stores could
// alias the buffers they come from.
template <int Taps, core::arm::Range R>
ETFUSE_NEON_NOCONTRACT ETFUSE_ALWAYS_INLINE void block_pixels(const int16_t* xb, const int64_t* out_at, int64_t P,
                                                              const int64_t* off_in, int taps,
                                                              const int16x8_t* w_in, const float32x4_t (&sb)[4],
                                                              const ep::RequantNeon& e, uint8_t* ob) {
  constexpr bool kFixed = Taps > 0;
  int16x8_t wl[kFixed ? Taps : 1];
  int64_t ol[kFixed ? Taps : 1];
  if (kFixed) {
    for (int k = 0; k < Taps; ++k) wl[k] = w_in[k], ol[k] = off_in[k];
  }
  const int16x8_t* w = kFixed ? wl : w_in;
  const int64_t* off = kFixed ? ol : off_in;
  const int n = kFixed ? Taps : taps;
  for (int64_t q = 0; q < P; ++q) {
    const int16_t* at = xb + out_at[q];
    int16x8_t v = vld1q_s16(at + off[0]);
    int32x4_t a0 = vmull_s16(vget_low_s16(v), vget_low_s16(w[0])), a1 = vmull_high_s16(v, w[0]);
#pragma GCC unroll 25
    for (int k = 1; k < n; ++k) {
      v = vld1q_s16(at + off[k]);
      a0 = vmlal_s16(a0, vget_low_s16(v), vget_low_s16(w[k]));
      a1 = vmlal_high_s16(a1, v, w[k]);
    }
    // the biases are 0 without: y + 0 is y
    const float32x4_t y0 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(a0), sb[0]), sb[2]);
    const float32x4_t y1 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(a1), sb[1]), sb[3]);
    vst1_u8(ob + 8 * q, core::arm::requant8<R>(e, y0, y1));
  }
}

// Small maps (MobileNetV2's 960 channels on 3x3: rows of 3 fill 3 of a plane's 8 lanes), 8
// channels a vector: the block's 8 planes are transposed 8 x 8 bytes at a time into pixels of 8
// channels, as int16 x - x_zp, in a zero-padded [Hp][Wp][8] buffer; an output pixel is one load
// and two smlal a tap for the 8 channels, requantized with the channels' scales in lanes; the
// 8-channel bytes go back to their planes by the same transpose. Reads and writes stay inside
// the block's planes (contiguous: channels c0 .. c0 + nc), or copies where a read would pass
// the input's end.
ETFUSE_NEON_NOCONTRACT void channel_blocks(const Problem& pb, int64_t b0, int64_t b1) {
  const int64_t s = pb.stride[0], KW = pb.KW, taps = pb.KH * KW, HW = pb.H * pb.W, P = pb.OH * pb.OW;
  const int64_t Wp = pb.W + 2 * pb.padding[1], Hp = pb.H + 2 * pb.padding[0], B = (pb.C + 7) / 8;
  const int64_t HW8 = (HW + 7) / 8 * 8, P8 = (P + 7) / 8 * 8, taps8 = (taps + 7) / 8 * 8;
  thread_local std::vector<int16_t> xbuf;
  thread_local std::vector<int16x8_t> wbuf;
  thread_local std::vector<uint8_t> obuf, copy;
  thread_local std::vector<int64_t> offsets;
  thread_local std::vector<int16_t*> to_buf;
  // the padding stays 0: only interiors are written; 8 more: where pixels past the map go
  xbuf.assign(static_cast<size_t>(Hp * Wp * 8 + 8), 0);
  wbuf.resize(static_cast<size_t>(taps8));
  obuf.resize(static_cast<size_t>(P8 * 8));
  copy.resize(std::max(copy.size(), static_cast<size_t>(8 * std::max(HW, taps) + 16)));
  int16_t* const xb = xbuf.data();
  // where input pixel p goes (past the map: a slot no tap reads); where output pixel q reads and
  // where tap k is (int16 elements): no division in the loops
  to_buf.resize(static_cast<size_t>(HW8));
  int16_t** const in_to = to_buf.data();
  for (int64_t ih = 0, p = 0; ih < pb.H; ++ih)
    for (int64_t iw = 0; iw < pb.W; ++iw, ++p) in_to[p] = xb + ((ih + pb.padding[0]) * Wp + iw + pb.padding[1]) * 8;
  for (int64_t p = HW; p < HW8; ++p) in_to[p] = xb + Hp * Wp * 8;
  offsets.resize(static_cast<size_t>(P + taps));
  int64_t* const out_at = offsets.data();
  int64_t* const off = out_at + P;
  for (int64_t oh = 0, q = 0; oh < pb.OH; ++oh)
    for (int64_t ow = 0; ow < pb.OW; ++ow, ++q) out_at[q] = (oh * s * Wp + ow * s) * 8;
  for (int64_t kh = 0; kh < pb.KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) off[kh * KW + kw] = (kh * Wp + kw) * 8;
  const ep::RequantNeon e = core::arm::requant_neon(pb.requant);
  const core::arm::Range range = core::arm::range_of(pb.requant, pb.x_signed);
  const bool has_bias = pb.requant.bias != nullptr;
  const uint8_t* const x_end = pb.x + pb.N * pb.C * HW;
  const int8_t* const w_end = pb.wq + pb.C * taps;
  // x - x_zp as an unsigned difference: int8 bytes flipped to x + 128, the zero point moved alike
  const uint8x16_t flip = vdupq_n_u8(pb.x_signed ? 0x80 : 0);
  const uint8x16_t zp8 = vdupq_n_u8(static_cast<uint8_t>(static_cast<int32_t>(pb.x_zero_point) + (pb.x_signed ? 128 : 0)));
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n = blk / B, c0 = blk % B * 8;
    const int nc = static_cast<int>(std::min<int64_t>(8, pb.C - c0));
    // in: 8 pixels of the 8 planes at a time; the last row's last vector may read past its plane
    // (into the next, unused), but not past the input
    const uint8_t* x = pb.x + (n * pb.C + c0) * HW;
    if (x + (nc - 1) * HW + HW8 > x_end) {
      std::memcpy(copy.data(), x, static_cast<size_t>(nc * HW));
      x = copy.data();
    }
    const uint8_t* row[8];
    block_rows(x, HW, nc, row);
    for (int64_t p0 = 0; p0 < HW; p0 += 8) {
      uint8x16_t q[4];
      load_transposed(row, p0, q);
      int16_t* const* to = in_to + p0;
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // pixels 2j, 2j + 1: the difference wraps to the right int16
        const uint8x16_t v = veorq_u8(q[j], flip);
        vst1q_s16(to[2 * j], vreinterpretq_s16_u16(vsubl_u8(vget_low_u8(v), vget_low_u8(zp8))));
        vst1q_s16(to[2 * j + 1], vreinterpretq_s16_u16(vsubl_high_u8(v, zp8)));
      }
    }
    // the block's weights [taps][8 channels] as int16 w - w_zp, 8 taps at a time transposed as the input
    const int8_t* w = pb.wq + c0 * taps;
    if (w + (nc - 1) * taps + taps8 > w_end) {
      std::memcpy(copy.data(), w, static_cast<size_t>(nc * taps));
      w = reinterpret_cast<const int8_t*>(copy.data());
    }
    block_rows(reinterpret_cast<const uint8_t*>(w), taps, nc, row);
    int16_t zw[8] = {};
    for (int j = 0; pb.w_zp && j < nc; ++j) zw[j] = static_cast<int16_t>(pb.w_zp[c0 + j]);  // integral
    const int16x8_t zwv = vld1q_s16(zw);
    for (int64_t k0 = 0; k0 < taps; k0 += 8) {
      uint8x16_t q[4];
      load_transposed(row, k0, q);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int8x16_t v = vreinterpretq_s8_u8(q[j]);
        wbuf[k0 + 2 * j] = vsubq_s16(vmovl_s8(vget_low_s8(v)), zwv);
        wbuf[k0 + 2 * j + 1] = vsubq_s16(vmovl_high_s8(v), zwv);
      }
    }
    // the channels' scales and biases by lane (zero past nc)
    float32x4_t sv[4];
    if (nc == 8) {
      sv[0] = vld1q_f32(pb.requant.scale + c0), sv[1] = vld1q_f32(pb.requant.scale + c0 + 4);
      sv[2] = sv[3] = vdupq_n_f32(0.0f);
      if (has_bias) sv[2] = vld1q_f32(pb.requant.bias + c0), sv[3] = vld1q_f32(pb.requant.bias + c0 + 4);
    } else {
      float sb[4][4] = {};
      std::memcpy(sb[0], pb.requant.scale + c0, sizeof(float) * static_cast<size_t>(nc));
      if (has_bias) std::memcpy(sb[2], pb.requant.bias + c0, sizeof(float) * static_cast<size_t>(nc));
      for (int j = 0; j < 4; ++j) sv[j] = vld1q_f32(sb[j]);
    }
    uint8_t* const ob = obuf.data();
    const int16x8_t* const wv = wbuf.data();
    const int tp = static_cast<int>(taps);
    switch (range) {
      case core::arm::Range::kInt8:
        if (taps == 9) block_pixels<9, core::arm::Range::kInt8>(xb, out_at, P, off, tp, wv, sv, e, ob);
        else block_pixels<0, core::arm::Range::kInt8>(xb, out_at, P, off, tp, wv, sv, e, ob);
        break;
      case core::arm::Range::kUint8:
        if (taps == 9) block_pixels<9, core::arm::Range::kUint8>(xb, out_at, P, off, tp, wv, sv, e, ob);
        else block_pixels<0, core::arm::Range::kUint8>(xb, out_at, P, off, tp, wv, sv, e, ob);
        break;
      default:
        if (taps == 9) block_pixels<9, core::arm::Range::kClamp>(xb, out_at, P, off, tp, wv, sv, e, ob);
        else block_pixels<0, core::arm::Range::kClamp>(xb, out_at, P, off, tp, wv, sv, e, ob);
    }
    // out: 8 pixels of the 8 channels at a time, the last (partial) 8 first: its 8-byte stores
    // run into the next plane's first pixels, which the later ones write; inside the block only
    uint8_t* const out = pb.out + (n * pb.C + c0) * P;
    const int64_t region = nc * P;
    for (int64_t p0 = (P - 1) / 8 * 8; p0 >= 0; p0 -= 8) {
      uint8x16_t q[4];
      for (int j = 0; j < 4; ++j) q[j] = vcombine_u8(vld1_u8(ob + 8 * (p0 + j)), vld1_u8(ob + 8 * (p0 + j + 4)));
      transpose8x8(q);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        if (c >= nc) break;
        const uint8x8_t v = c % 2 ? vget_high_u8(q[c / 2]) : vget_low_u8(q[c / 2]);
        uint8_t* dst = out + c * P + p0;
        if (c * P + p0 + 8 <= region) {
          vst1_u8(dst, v);
        } else {
          core::arm::store_bytes(dst, v, P - p0);
        }
      }
    }
  }
}
#endif  // ETFUSE_CORE_KERNELS

}  // namespace detail

// Output maps up to this many pixels run 8 channels a vector (detail::channel_blocks), larger
// ones plane by plane (detail::planes): the blocks ran fewer instructions on MobileNetV2's maps
// up to 24x24 (half on 12x12, 5% on 24x24), 10% more on 48x48 (docs/performance.md).
constexpr int64_t kChannelBlockMaxPixels = 576;
inline bool uses_channel_blocks(const Problem& pb) { return pb.OH * pb.OW <= kChannelBlockMaxPixels; }

// The whole conv; `par` a parallel_for over planes (or blocks of 8 channels).
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  const int64_t planes = pb.N * pb.C;
  if (planes == 0 || pb.OH == 0 || pb.OW == 0) return;
  if (uses_channel_blocks(pb)) {
    const int64_t blocks = pb.N * ((pb.C + 7) / 8);
    // in the float GEMM's multiply-adds (kParallelMinMacs): per output pixel of 8 channels a
    // load and two smlal a tap, the epilogue about 16; the transposes about 1 an input
    const int64_t per_block = pb.OH * pb.OW * (3 * pb.KH * pb.KW + 16) + 8 * pb.H * pb.W;
    SerialBelow<Par>{par, blocks * per_block < kParallelMinMacs}(
        int64_t(0), blocks, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, per_block)),
        [&](int64_t b, int64_t e) { detail::channel_blocks(pb, b, e); });
    return;
  }
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
