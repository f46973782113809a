// max_pool2d's NEON planes (core/pool2d.h declares and picks them; compiled once per library, in
// core/kernels.cpp: -DETFUSE_CORE_KERNELS): the AVX-512 planes' two passes, 4 outputs a vector.
// The portable loop's strided pass along the width stays scalar under GCC (SqueezeNet's three
// 3x3 stride-2 pools: 8% of its instructions on aarch64); here stride 2 is vld2q's even lanes.
// NEON's fmax propagates NaN, as torch's max does.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/pool2d.h"

namespace etfuse {
namespace core {
namespace pool2d {
namespace arm {

using detail::kMaxRows;
using detail::kRowSlack;
using detail::max_nan;

void max_planes_neon(const float* in, float* out, const detail::Plane& g, const Params& p, int64_t row_len, int64_t q0,
                     int64_t q1) {
  const int64_t kw = p.kernel[1], sw = p.stride[1], pw = p.padding[1];
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> row(static_cast<size_t>(row_len + kRowSlack), ninf);
  float* body = row.data() + pw;
  for (int64_t q = q0; q < q1; ++q) {
    const float* plane = in + q * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const float* src[kMaxRows];
      const int rows = detail::window_rows(plane, g, p, oy, src);
      // down the rows into body (no row inside the plane, ceil_mode: -inf); the last vector ends
      // at the row's end, overlapping the one before (the same values again): no scalar tail
      int64_t x = 0;
      if (g.w >= 4) {
        for (;; x += 4) {
          if (x + 4 > g.w) x = g.w - 4;
          float32x4_t acc = vdupq_n_f32(ninf);
          for (int r = 0; r < rows; ++r) acc = r ? vmaxq_f32(acc, vld1q_f32(src[r] + x)) : vld1q_f32(src[r] + x);
          vst1q_f32(body + x, acc);
          if (x + 4 >= g.w) break;
        }
        x = g.w;
      }
      for (; x < g.w; ++x) {
        float acc = ninf;
        for (int r = 0; r < rows; ++r) acc = r ? max_nan(acc, src[r][x]) : src[r][x];
        body[x] = acc;
      }
      float* dst = out + q * g.oh * g.ow + oy * g.ow;
      int64_t ox = 0;  // then along the width, the last vector again ending at the row's end
      if (g.ow >= 4) {
        for (;; ox += 4) {
          if (ox + 4 > g.ow) ox = g.ow - 4;
          const float* r = row.data() + ox * sw;
          float32x4_t acc = sw == 1 ? vld1q_f32(r) : vld2q_f32(r).val[0];
          for (int64_t kx = 1; kx < kw; ++kx) acc = vmaxq_f32(acc, sw == 1 ? vld1q_f32(r + kx) : vld2q_f32(r + kx).val[0]);
          vst1q_f32(dst + ox, acc);
          if (ox + 4 >= g.ow) break;
        }
        ox = g.ow;
      }
      for (; ox < g.ow; ++ox) {
        float acc = row[ox * sw];
        for (int64_t kx = 1; kx < kw; ++kx) acc = max_nan(acc, row[ox * sw + kx]);
        dst[ox] = acc;
      }
    }
  }
}

}  // namespace arm
}  // namespace pool2d
}  // namespace core
}  // namespace etfuse
