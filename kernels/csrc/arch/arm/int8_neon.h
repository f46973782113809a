// The int8 pointwise conv (core/int8_pointwise.h's Problem: acc[c, p] = sum_k w[c, k] * (x[k, p] - x_zp),
// exact in int32, then requantized) on aarch64, in two kernels:
//   * dot: ARMv8.2 sdot (vdotq_laneq_s32, 16 multiply-adds an instruction), compiled for
//     armv8.2-a+dotprod alone (arm_neon.h declares sdot for that target) so the library stays
//     ARMv8.0; taken where HWCAP_ASIMDDP says the core has it.
//     The input is interleaved per 64-pixel tile into [K4 / 4][64][4] (4 k of 4 pixels a vector),
//     the weight into 8-channel quads [C8 / 8][K4 / 4][8][4]; each sdot takes one channel's 4 k by
//     lane, so a vector of sums is 4 pixels of one channel (NCHW stores, no transpose). The
//     products are signed x signed: uint8 activations are flipped to x - 128 (x ^ 0x80), and
//       sum_k w * (x - x_zp) = sdot(x', w) - (x_zp - flip) * sum_k w
//     so the sums start at the second term (as the x86 VNNI kernel's).
//   * mlal (Cortex-A53 and other ARMv8.0 cores): x - x_zp widened to int16 (in [-255, 255]),
//     times the int16 weight by lane into int32 (smlal / smlal2, 4 multiply-adds each, as
//     XNNPACK's qs8 neon-mlal-lane kernels); int16 x int16 products cannot overflow, unlike
//     pairs of int8 products summed in int16 (-128 * -128 * 2 = 32768).
// Micro tile: 8 channels x 8 pixels, 16 int32x4 sums. The epilogue is requant_loop's float
// steps in its order with contraction off (vmulq_f32 and vaddq_f32 are plain * and + to GCC),
// its integer tail in int16.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/common.h"
#include "arch/arm/requant_neon.h"
#include "core/int8_epilogue.h"

#define ETFUSE_NEON_NOCONTRACT __attribute__((optimize("fp-contract=off")))
#define ETFUSE_NEON_DOT __attribute__((target("arch=armv8.2-a+dotprod"), optimize("fp-contract=off")))

namespace etfuse {
namespace core {
namespace int8_pointwise {
namespace arm {

using int8_epilogue::Requant;

constexpr int kCh = 8;         // output channels per micro tile
constexpr int kPx = 8;         // pixels per micro tile
constexpr int64_t kTile = 64;  // pixels per task

// The weight as the kernel reads it, rebuilt per call (C x K bytes against C x K x N x P
// multiply-adds).
struct Weights {
  const int8_t* quads = nullptr;  // dot: [C8 / 8][K4 / 4][8][4], zero past C and K
  const int32_t* starts = nullptr;  // dot: the sums' start, -(x_zp - flip) * sum_k w[c, k], C8 entries
  const int16_t* wide = nullptr;  // mlal: [C8 / 8][K][8], zero past C
};

namespace detail {

ETFUSE_NEON_DOT void tile_dot(const Problem& pb, const Weights& w, int64_t n, int64_t t, int64_t c_begin,
                              int64_t c_end);
ETFUSE_NEON_NOCONTRACT void tile_mlal(const Problem& pb, const Weights& w, int64_t n, int64_t t, int64_t c_begin,
                                      int64_t c_end);
void quads_from_panels(const int8_t* panels, int64_t C, int64_t K, int8_t* quads, int32_t* sums);
void quads_from_rows(const int8_t* rows, int64_t C, int64_t K, int8_t* quads, int32_t* sums);
void wide_from_panels(const int8_t* panels, int64_t C, int64_t K, int16_t* wide);

#if defined(ETFUSE_CORE_KERNELS)
using core::arm::Range;
using core::arm::requant8;
using core::arm::RequantNeon;

// 8 sums (two vectors) of channel c -> 8 bytes at dst (n of them).
ETFUSE_NEON_NOCONTRACT ETFUSE_ALWAYS_INLINE void requant_store8(const Requant& r, const RequantNeon& e, int64_t c,
                                                               int32x4_t a0, int32x4_t a1, int64_t n, uint8_t* dst) {
  const float s = r.scale[c];
  float32x4_t y0 = vmulq_n_f32(vcvtq_f32_s32(a0), s), y1 = vmulq_n_f32(vcvtq_f32_s32(a1), s);
  if (r.bias) {
    const float32x4_t b = vdupq_n_f32(r.bias[c]);
    y0 = vaddq_f32(y0, b);
    y1 = vaddq_f32(y1, b);
  }
  core::arm::store_bytes(dst, requant8(e, y0, y1), n);
}

// The task's pixels [p0, p0 + npx) of x[K][P]: in place, or (a tile past P's end) copied into
// `buf` [K][kTile] so every 8-pixel load stays inside it. Returns the rows and sets their stride.
inline const uint8_t* tile_rows(const Problem& pb, const uint8_t* x, int64_t p0, int64_t npx, std::vector<uint8_t>& buf,
                                int64_t& stride) {
  if (npx % kPx == 0) {
    stride = pb.P;
    return x + p0;
  }
  buf.assign(static_cast<size_t>(pb.K * kTile), 0);
  for (int64_t k = 0; k < pb.K; ++k) std::memcpy(buf.data() + k * kTile, x + k * pb.P + p0, static_cast<size_t>(npx));
  stride = kTile;
  return buf.data();
}

#define ETFUSE_DOT8(v, x)                                    \
  acc[0][v] = vdotq_laneq_s32(acc[0][v], x, w0, 0);          \
  acc[1][v] = vdotq_laneq_s32(acc[1][v], x, w0, 1);          \
  acc[2][v] = vdotq_laneq_s32(acc[2][v], x, w0, 2);          \
  acc[3][v] = vdotq_laneq_s32(acc[3][v], x, w0, 3);          \
  acc[4][v] = vdotq_laneq_s32(acc[4][v], x, w1, 0);          \
  acc[5][v] = vdotq_laneq_s32(acc[5][v], x, w1, 1);          \
  acc[6][v] = vdotq_laneq_s32(acc[6][v], x, w1, 2);          \
  acc[7][v] = vdotq_laneq_s32(acc[7][v], x, w1, 3)

// Channel m's 8 sums -> 8 bytes q_: requant_store8's steps, with the block's scales and biases in
// registers (sv, bv: lanes by channel, biases 0 without: y + 0 is y) instead of reloaded per
// channel past the byte stores.
#define ETFUSE_REQUANT_DOT(m)                                                                        \
  float32x4_t y0 = vmulq_laneq_f32(vcvtq_f32_s32(acc[m][0]), sv[m / 4], m % 4);                      \
  float32x4_t y1 = vmulq_laneq_f32(vcvtq_f32_s32(acc[m][1]), sv[m / 4], m % 4);                      \
  y0 = vaddq_f32(y0, vdupq_laneq_f32(bv[m / 4], m % 4));                                             \
  y1 = vaddq_f32(y1, vdupq_laneq_f32(bv[m / 4], m % 4));                                             \
  const uint8x8_t q_ = requant8<R>(e, y0, y1)

// Channel m of a whole micro tile (8 channels, 8 pixels), or of a partial one.
#define ETFUSE_STORE_DOT(m)     \
  {                             \
    ETFUSE_REQUANT_DOT(m);      \
    vst1_u8(o + (m) * P, q_);   \
  }
#define ETFUSE_STORE_DOT_PART(m)                      \
  if (m < rows) {                                     \
    ETFUSE_REQUANT_DOT(m);                            \
    core::arm::store_bytes(o + (m) * P, q_, npx - s); \
  }

template <Range R>
ETFUSE_NEON_DOT ETFUSE_ALWAYS_INLINE void tile_dot_range(const Problem& pb, const Weights& w, int64_t n, int64_t t,
                                                         int64_t c_begin, int64_t c_end) {
  thread_local std::vector<int8_t> xq_buf;
  const int64_t K4 = k_padded(pb.K), p0 = t * kTile, npx = std::min(kTile, pb.P - p0);
  if (static_cast<int64_t>(xq_buf.size()) < K4 * kTile) xq_buf.resize(static_cast<size_t>(K4 * kTile));
  int8_t* const xq = xq_buf.data();
  const uint8_t* x = pb.x + n * pb.K * pb.P + p0;
  const uint8_t* const x_end = pb.x + pb.N * pb.K * pb.P;
  // interleave: 4 rows of 16 pixels -> 16 groups of 4 k (two rounds of zips), flipped for uint8.
  // Past the tile's pixels a load reads the next row's (their sums are never stored); only past
  // the input's end it copies the row's last pixels. K and P in locals: the stores may alias pb.
  const int64_t K = pb.K, P = pb.P;
  const bool flips = !pb.x_signed;
  const int8x16_t flip = vdupq_n_s8(flips ? static_cast<int8_t>(0x80) : 0);
  const int64_t groups = (npx + 15) / 16;
  const auto zip_store = [](const int8x16_t (&r)[4], int8_t* dst) {
    const int16x8_t a = vreinterpretq_s16_s8(vzip1q_s8(r[0], r[1])), b = vreinterpretq_s16_s8(vzip2q_s8(r[0], r[1]));
    const int16x8_t c = vreinterpretq_s16_s8(vzip1q_s8(r[2], r[3])), d = vreinterpretq_s16_s8(vzip2q_s8(r[2], r[3]));
    vst1q_s8(dst, vreinterpretq_s8_s16(vzip1q_s16(a, c)));
    vst1q_s8(dst + 16, vreinterpretq_s8_s16(vzip2q_s16(a, c)));
    vst1q_s8(dst + 32, vreinterpretq_s8_s16(vzip1q_s16(b, d)));
    vst1q_s8(dst + 48, vreinterpretq_s8_s16(vzip2q_s16(b, d)));
  };
  int64_t k = 0;
  for (; k + 4 <= K && x + (k + 3) * P + 16 * groups <= x_end; k += 4) {  // 4 rows, in place
    const int8_t* src = reinterpret_cast<const int8_t*>(x + k * P);
    int8_t* dst = xq + k * kTile;
    for (int64_t g = 0; g < groups; ++g, src += 16, dst += 64) {
      int8x16_t r[4] = {vld1q_s8(src), vld1q_s8(src + P), vld1q_s8(src + 2 * P), vld1q_s8(src + 3 * P)};
      if (flips) {
        for (int j = 0; j < 4; ++j) r[j] = veorq_s8(r[j], flip);
      }
      zip_store(r, dst);
    }
  }
  for (; k < K4; k += 4) {  // rows past K (zero) or near the input's end
    for (int64_t g = 0; g < groups; ++g) {
      int8x16_t r[4];
      for (int j = 0; j < 4; ++j) {
        const uint8_t* src = x + (k + j) * P + 16 * g;
        if (k + j >= K) {
          r[j] = vdupq_n_s8(0);
        } else if (src + 16 <= x_end) {
          r[j] = veorq_s8(vld1q_s8(reinterpret_cast<const int8_t*>(src)), flip);
        } else {
          int8_t last[16] = {};
          std::memcpy(last, src, static_cast<size_t>(npx - 16 * g));
          r[j] = veorq_s8(vld1q_s8(last), flip);
        }
      }
      zip_store(r, xq + (k * kTile + 64 * g));
    }
  }
  const RequantNeon e = core::arm::requant_neon(pb.requant);
  const float* const scale = pb.requant.scale;
  const float* const bias = pb.requant.bias;
  uint8_t* const out = pb.out + n * pb.C * pb.P + p0;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kCh) {
    const int8_t* wb = w.quads + (c0 / kCh) * K4 * kCh;
    const int rows = static_cast<int>(std::min<int64_t>(kCh, pb.C - c0));
    float sb[2][kCh] = {};  // the block's scales and biases, zero past C
    std::memcpy(sb[0], scale + c0, sizeof(float) * static_cast<size_t>(rows));
    if (bias) std::memcpy(sb[1], bias + c0, sizeof(float) * static_cast<size_t>(rows));
    const float32x4_t sv[2] = {vld1q_f32(sb[0]), vld1q_f32(sb[0] + 4)};
    const float32x4_t bv[2] = {vld1q_f32(sb[1]), vld1q_f32(sb[1] + 4)};
    const int32x4_t z0 = vld1q_s32(w.starts + c0), z1 = vld1q_s32(w.starts + c0 + 4);
    uint8_t* o = out + c0 * pb.P;
    for (int64_t s = 0; s < npx; s += kPx, o += kPx) {
      int32x4_t acc[kCh][2];
      acc[0][0] = acc[0][1] = vdupq_laneq_s32(z0, 0);
      acc[1][0] = acc[1][1] = vdupq_laneq_s32(z0, 1);
      acc[2][0] = acc[2][1] = vdupq_laneq_s32(z0, 2);
      acc[3][0] = acc[3][1] = vdupq_laneq_s32(z0, 3);
      acc[4][0] = acc[4][1] = vdupq_laneq_s32(z1, 0);
      acc[5][0] = acc[5][1] = vdupq_laneq_s32(z1, 1);
      acc[6][0] = acc[6][1] = vdupq_laneq_s32(z1, 2);
      acc[7][0] = acc[7][1] = vdupq_laneq_s32(z1, 3);
      const int8_t* xp = xq + 4 * s;
      const int8_t* wp = wb;
      const int8_t* const xp_end = xp + K4 * kTile;
      if ((K4 / 4) % 2) {  // then pairs of k-quads: one loop test per 32 sdot
        const int8x16_t x0 = vld1q_s8(xp), x1 = vld1q_s8(xp + 16);
        const int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16);
        ETFUSE_DOT8(0, x0);
        ETFUSE_DOT8(1, x1);
        xp += 4 * kTile;
        wp += 4 * kCh;
      }
      for (; xp != xp_end; xp += 8 * kTile, wp += 8 * kCh) {
        {
          const int8x16_t x0 = vld1q_s8(xp), x1 = vld1q_s8(xp + 16);
          const int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16);
          ETFUSE_DOT8(0, x0);
          ETFUSE_DOT8(1, x1);
        }
        const int8x16_t x0 = vld1q_s8(xp + 4 * kTile), x1 = vld1q_s8(xp + 4 * kTile + 16);
        const int8x16_t w0 = vld1q_s8(wp + 4 * kCh), w1 = vld1q_s8(wp + 4 * kCh + 16);
        ETFUSE_DOT8(0, x0);
        ETFUSE_DOT8(1, x1);
      }
      if (npx - s >= kPx && rows == kCh) {
        ETFUSE_STORE_DOT(0)
        ETFUSE_STORE_DOT(1)
        ETFUSE_STORE_DOT(2)
        ETFUSE_STORE_DOT(3)
        ETFUSE_STORE_DOT(4)
        ETFUSE_STORE_DOT(5)
        ETFUSE_STORE_DOT(6)
        ETFUSE_STORE_DOT(7)
      } else {
        ETFUSE_STORE_DOT_PART(0)
        ETFUSE_STORE_DOT_PART(1)
        ETFUSE_STORE_DOT_PART(2)
        ETFUSE_STORE_DOT_PART(3)
        ETFUSE_STORE_DOT_PART(4)
        ETFUSE_STORE_DOT_PART(5)
        ETFUSE_STORE_DOT_PART(6)
        ETFUSE_STORE_DOT_PART(7)
      }
    }
  }
}
#undef ETFUSE_STORE_DOT_PART
#undef ETFUSE_STORE_DOT
#undef ETFUSE_REQUANT_DOT

ETFUSE_NEON_DOT void tile_dot(const Problem& pb, const Weights& w, int64_t n, int64_t t, int64_t c_begin,
                              int64_t c_end) {
  switch (core::arm::range_of(pb.requant, pb.x_signed)) {
    case Range::kInt8: return tile_dot_range<Range::kInt8>(pb, w, n, t, c_begin, c_end);
    case Range::kUint8: return tile_dot_range<Range::kUint8>(pb, w, n, t, c_begin, c_end);
    default: return tile_dot_range<Range::kClamp>(pb, w, n, t, c_begin, c_end);
  }
}
#undef ETFUSE_DOT8

#define ETFUSE_MLAL(m, lane)                                  \
  acc[m][0] = vmlal_laneq_s16(acc[m][0], lo, wv, lane);      \
  acc[m][1] = vmlal_high_laneq_s16(acc[m][1], xv, wv, lane)

ETFUSE_NEON_NOCONTRACT void tile_mlal(const Problem& pb, const Weights& w, int64_t n, int64_t t, int64_t c_begin,
                                      int64_t c_end) {
  thread_local std::vector<uint8_t> rows_buf;
  const int64_t p0 = t * kTile, npx = std::min(kTile, pb.P - p0);
  int64_t stride = 0;
  const uint8_t* x = tile_rows(pb, pb.x + n * pb.K * pb.P, p0, npx, rows_buf, stride);
  const int16x8_t zp = vdupq_n_s16(static_cast<int16_t>(pb.x_zero_point));
  const RequantNeon e = core::arm::requant_neon(pb.requant);
  uint8_t* out = pb.out + n * pb.C * pb.P + p0;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kCh) {
    const int16_t* wb = w.wide + (c0 / kCh) * pb.K * kCh;
    const int rows = static_cast<int>(std::min<int64_t>(kCh, pb.C - c0));
    for (int64_t s = 0; s < npx; s += kPx) {
      int32x4_t acc[kCh][2];
      for (int m = 0; m < kCh; ++m) acc[m][0] = acc[m][1] = vdupq_n_s32(0);
      const uint8_t* xs = x + s;
      for (int64_t k = 0; k < pb.K; ++k) {
        const uint8x8_t b = vld1_u8(xs + k * stride);
        const int16x8_t xv = vsubq_s16(
            pb.x_signed ? vmovl_s8(vreinterpret_s8_u8(b)) : vreinterpretq_s16_u16(vmovl_u8(b)), zp);
        const int16x4_t lo = vget_low_s16(xv);
        const int16x8_t wv = vld1q_s16(wb + k * kCh);
        ETFUSE_MLAL(0, 0);
        ETFUSE_MLAL(1, 1);
        ETFUSE_MLAL(2, 2);
        ETFUSE_MLAL(3, 3);
        ETFUSE_MLAL(4, 4);
        ETFUSE_MLAL(5, 5);
        ETFUSE_MLAL(6, 6);
        ETFUSE_MLAL(7, 7);
      }
#pragma GCC unroll 8
      for (int m = 0; m < kCh; ++m) {  // unrolled: the sums stay in registers
        if (m < rows) requant_store8(pb.requant, e, c0 + m, acc[m][0], acc[m][1], npx - s, out + (c0 + m) * pb.P + s);
      }
    }
  }
}
#undef ETFUSE_MLAL

// Per-channel sums of the quads [C8 / 8][K4 / 4][8][4]: each 16 bytes are 4 channels' 4 k.
static void quad_sums(const int8_t* quads, int64_t C8, int64_t K4, int32_t* sums) {
  for (int64_t b = 0; b < C8 / kCh; ++b) {
    int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
    const int8_t* q = quads + b * K4 * kCh;
    for (int64_t k = 0; k < K4; k += 4, q += 4 * kCh) {
      s0 = vpadalq_s16(s0, vpaddlq_s8(vld1q_s8(q)));
      s1 = vpadalq_s16(s1, vpaddlq_s8(vld1q_s8(q + 16)));
    }
    vst1q_s32(sums + b * kCh, s0);
    vst1q_s32(sums + b * kCh + 4, s1);
  }
}

// The packed ops' panels [C16 / 16][K][16] (zero past C) -> quads: 4 rows of a panel's 16
// channels are one k-quad of two 8-channel blocks, a 4 x 16 byte transpose in two rounds of zips;
// the channels' sums taken from the transposed vectors in the same pass (pairwise adds).
void quads_from_panels(const int8_t* panels, int64_t C, int64_t K, int8_t* quads, int32_t* sums) {
  const int64_t C8 = (C + kCh - 1) / kCh * kCh, K4 = k_padded(K), whole = K / 4 * 4;
  for (int64_t p = 0; p < (C + 15) / 16; ++p) {
    const int8_t* panel = panels + p * K * 16;
    int8_t* lo = quads + 2 * p * K4 * kCh;
    const bool two = 16 * p + kCh < C8;  // no second block past C8
    int8_t* hi = two ? lo + K4 * kCh : lo;  // (one block: its stores go to the first block's, rewritten after)
    int32x4_t s[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    const auto quad = [&](const int8x16_t (&r)[4], int64_t k) {
      const int16x8_t a = vreinterpretq_s16_s8(vzip1q_s8(r[0], r[1])), b = vreinterpretq_s16_s8(vzip2q_s8(r[0], r[1]));
      const int16x8_t c = vreinterpretq_s16_s8(vzip1q_s8(r[2], r[3])), d = vreinterpretq_s16_s8(vzip2q_s8(r[2], r[3]));
      const int8x16_t q[4] = {vreinterpretq_s8_s16(vzip1q_s16(b, d)), vreinterpretq_s8_s16(vzip2q_s16(b, d)),
                              vreinterpretq_s8_s16(vzip1q_s16(a, c)), vreinterpretq_s8_s16(vzip2q_s16(a, c))};
      // the high block first: with one block, `hi` is `lo` and the low block's stores win
      vst1q_s8(hi + k * kCh, q[0]);
      vst1q_s8(hi + k * kCh + 16, q[1]);
      vst1q_s8(lo + k * kCh, q[2]);
      vst1q_s8(lo + k * kCh + 16, q[3]);
      for (int j = 0; j < 4; ++j) s[j] = vpadalq_s16(s[j], vpaddlq_s8(q[j]));
    };
    int64_t k = 0;
    for (; k < whole; k += 4) {
      const int8x16_t r[4] = {vld1q_s8(panel + k * 16), vld1q_s8(panel + k * 16 + 16), vld1q_s8(panel + k * 16 + 32),
                              vld1q_s8(panel + k * 16 + 48)};
      quad(r, k);
    }
    if (k < K4) {  // the last rows, zero past K
      int8x16_t r[4];
      for (int j = 0; j < 4; ++j) r[j] = k + j < K ? vld1q_s8(panel + (k + j) * 16) : vdupq_n_s8(0);
      quad(r, k);
    }
    vst1q_s32(sums + 16 * p, s[2]);
    vst1q_s32(sums + 16 * p + 4, s[3]);
    if (two) {
      vst1q_s32(sums + 16 * p + 8, s[0]);
      vst1q_s32(sums + 16 * p + 12, s[1]);
    }
  }
}

// Rows [C][K] -> quads (`quads` zeroed by the caller): 16 k of a row are 4 quads' words.
void quads_from_rows(const int8_t* rows, int64_t C, int64_t K, int8_t* quads, int32_t* sums) {
  const int64_t C8 = (C + kCh - 1) / kCh * kCh, K4 = k_padded(K);
  for (int64_t c = 0; c < C; ++c) {
    const int8_t* src = rows + c * K;
    int8_t* q = quads + (c / kCh) * K4 * kCh + (c % kCh) * 4;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16, q += 16 * kCh) {
      const uint32x4_t v = vreinterpretq_u32_s8(vld1q_s8(src + k));
      vst1q_lane_u32(reinterpret_cast<uint32_t*>(q), v, 0);
      vst1q_lane_u32(reinterpret_cast<uint32_t*>(q + 4 * kCh), v, 1);
      vst1q_lane_u32(reinterpret_cast<uint32_t*>(q + 8 * kCh), v, 2);
      vst1q_lane_u32(reinterpret_cast<uint32_t*>(q + 12 * kCh), v, 3);
    }
    for (int64_t j = 0; k + j < K; ++j) q[(j / 4) * 4 * kCh + j % 4] = src[k + j];
  }
  quad_sums(quads, C8, K4, sums);
}

// Panels -> the mlal kernel's [C8 / 8][K][8] int16: a panel row's halves are two blocks' rows.
void wide_from_panels(const int8_t* panels, int64_t C, int64_t K, int16_t* wide) {
  const int64_t C8 = (C + kCh - 1) / kCh * kCh;
  for (int64_t p = 0; p < (C + 15) / 16; ++p) {
    const int8_t* panel = panels + p * K * 16;
    int16_t* lo = wide + 2 * p * K * kCh;
    int16_t* hi = 16 * p + kCh < C8 ? lo + K * kCh : nullptr;
    for (int64_t k = 0; k < K; ++k) {
      const int8x16_t v = vld1q_s8(panel + k * 16);
      vst1q_s16(lo + k * kCh, vmovl_s8(vget_low_s8(v)));
      if (hi) vst1q_s16(hi + k * kCh, vmovl_high_s8(v));
    }
  }
}
#endif  // ETFUSE_CORE_KERNELS

}  // namespace detail

// im2col's strided rows (core/int8_epilogue.h's im2col): stride 2 one vld2 per 16 outputs, its
// even bytes (the first conv of MobileNetV2, 3x3 stride 2 over 96x96: 27 rows of 48 bytes an
// output row, copied byte by byte before). The last vector reads one byte past the last tap:
// inside the padded row or its 64 spare bytes.
inline void strided_row(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride) {
  if (stride != 2) return int8_epilogue::strided_bytes(dst, src, n, stride);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vst1q_u8(dst + i, vld2q_u8(src + 2 * i).val[0]);
  for (; i < n; ++i) dst[i] = src[2 * i];
}

// The kernel's weight layout, in buffers of the calling thread kept between calls.
inline Weights prepare(const Problem& pb, bool dot) {
  const int64_t C8 = (pb.C + kCh - 1) / kCh * kCh, K4 = k_padded(pb.K);
  Weights w;
  if (dot) {
    thread_local std::vector<int8_t> quads;
    thread_local std::vector<int32_t> sums;
    sums.resize(static_cast<size_t>(C8));
    if (pb.panels) {  // every byte written
      quads.resize(static_cast<size_t>(C8 * K4));
      detail::quads_from_panels(pb.w, pb.C, pb.K, quads.data(), sums.data());
    } else {
      quads.assign(static_cast<size_t>(C8 * K4), 0);
      detail::quads_from_rows(pb.w, pb.C, pb.K, quads.data(), sums.data());
    }
    const int32_t shift = pb.x_zero_point - (pb.x_signed ? 0 : 128);
    for (int64_t c = 0; c < C8; ++c) sums[c] *= -shift;
    w.quads = quads.data();
    w.starts = sums.data();
  } else {
    thread_local std::vector<int16_t> wide;
    if (pb.panels) {
      wide.resize(static_cast<size_t>(C8 * pb.K));
      detail::wide_from_panels(pb.w, pb.C, pb.K, wide.data());
    } else {
      wide.assign(static_cast<size_t>(C8 * pb.K), 0);
      for (int64_t c = 0; c < pb.C; ++c) {
        int16_t* dst = wide.data() + (c / kCh) * pb.K * kCh + c % kCh;
        for (int64_t k = 0; k < pb.K; ++k) dst[k * kCh] = pb.w[c * pb.K + k];
      }
    }
    w.wide = wide.data();
  }
  return w;
}

// The whole conv; `par` a parallel_for over 64-pixel tiles of each image (and blocks of output
// channels where there are fewer than 8 tiles).
template <class Par>
inline void run(const Problem& pb, bool dot, Par&& par) {
  if (pb.N == 0 || pb.C == 0 || pb.P == 0) return;
  const Weights w = prepare(pb, dot);
  const int64_t tiles = (pb.P + kTile - 1) / kTile;
  const int64_t blocks = pb.N * tiles >= 8 ? 1 : std::min<int64_t>((8 + pb.N * tiles - 1) / (pb.N * tiles),
                                                                   std::max<int64_t>(1, pb.C / 16));
  const int64_t per_block = ((pb.C + blocks - 1) / blocks + kCh - 1) / kCh * kCh;
  const int64_t units = pb.N * tiles * blocks;
  const int64_t work = pb.N * pb.P * pb.C * (k_padded(pb.K) / (dot ? 4 : 1) + 16);
  SerialBelow<Par>{par, work < kParallelMinMacs}(int64_t(0), units, 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t tile = u / blocks, c0 = (u % blocks) * per_block, c1 = std::min(pb.C, c0 + per_block);
      if (c0 >= c1) continue;
      if (dot) {
        detail::tile_dot(pb, w, tile / tiles, tile % tiles, c0, c1);
      } else {
        detail::tile_mlal(pb, w, tile / tiles, tile % tiles, c0, c1);
      }
    }
  });
}

}  // namespace arm
}  // namespace int8_pointwise
}  // namespace core
}  // namespace etfuse
