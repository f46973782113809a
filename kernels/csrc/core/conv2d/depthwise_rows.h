// A depthwise conv, 3x3 or 5x5 at stride 1 or 2, two output rows at a time by an ISA's row
// microkernel (depthwise_rows over arm::DepthwiseNeon). run_paths takes it on NEON after the
// blocks kernel (uses_depthwise_rows).
#pragma once

#include <vector>

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/depthwise_neon.h"
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// A depthwise conv (multiplier 1) with a square kernel at the same stride along both dims and
// no dilation, the sizes Micro::supports (arm::DepthwiseNeon: 3x3 and 5x5, stride 1 and 2), one
// plane per task: the plane is copied once into a zero-padded buffer (its border written once
// per call), then Micro::rows computes two output rows at a time from its rows, any padding
// and map size alike. Rows narrower than 4 or strided go through a small buffer.
template <class Micro>
ETFUSE_ALWAYS_INLINE void depthwise_rows(const Problem& pb, int64_t t0, int64_t t1) {
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], K = pb.lw.sizes[2], S = p.stride[0];
  const int64_t ph = p.padding[0], pw = p.padding[1];
  const int64_t n = OW < 4 ? 4 : OW;  // the columns computed per row
  // a row's reads: n outputs' vectors, at stride 2 ld2 of 8 floats from column 2j + K - 1
  int64_t PW = S * n + K + 8;
  if (PW < Wd + 2 * pw) PW = Wd + 2 * pw;
  PW = (PW + 3) / 4 * 4;
  int64_t PH = (OH - 1) * S + K;
  if (PH < H + 2 * ph) PH = H + 2 * ph;
  std::vector<float> pad(static_cast<size_t>(PH * PW), 0.0f);
  const bool in_place = OW >= 4 && pb.lo.strides[3] == 1;
  std::vector<float> tmp(in_place ? 0 : static_cast<size_t>(2 * n));
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const int act = p.has_max ? 2 : p.has_min ? 1 : 0;
  const auto one = Micro::template pick<1>(K, S, act), two = Micro::template pick<2>(K, S, act);
  float wl[28] = {};  // up to 5x5, whole vectors
  const int64_t ihs = pb.li.strides[2], iws = pb.li.strides[3];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t img = t / C, c = t % C;
    const float* src = pb.in + img * pb.li.strides[0] + c * pb.li.strides[1];
    float* dst = pb.out + img * pb.lo.strides[0] + c * pb.lo.strides[1];
    for (int64_t ih = 0; ih < H; ++ih) {
      float* d = pad.data() + (ih + ph) * PW + pw;
      if (iws == 1) {
        copy_row<4>(d, src + ih * ihs, Wd);
      } else {
        for (int64_t iw = 0; iw < Wd; ++iw) d[iw] = src[ih * ihs + iw * iws];
      }
    }
    // the per-channel scale folded into the weights, the bias as the sums' seed (as direct_planes)
    const float s = pb.scale ? pb.scale[c * pb.scale_s] : 1.0f;
    const float* wk = pb.w + c * pb.lw.strides[0];
    for (int64_t kh = 0; kh < K; ++kh)
      for (int64_t kw = 0; kw < K; ++kw) wl[kh * K + kw] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
    const float seed = pb.bias ? pb.bias[c * pb.bias_s] : 0.0f;
    for (int64_t oh = 0; oh < OH; oh += 2) {
      const int64_t R = OH - oh < 2 ? 1 : 2;
      const float* in = pad.data() + oh * S * PW;
      if (in_place) {
        (R == 2 ? two : one)(in, PW, wl, seed, lo_v, hi_v, dst + oh * pb.lo.strides[2], pb.lo.strides[2], n);
        continue;
      }
      (R == 2 ? two : one)(in, PW, wl, seed, lo_v, hi_v, tmp.data(), n, n);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t ow = 0; ow < OW; ++ow) dst[(oh + r) * pb.lo.strides[2] + ow * pb.lo.strides[3]] = tmp[r * n + ow];
    }
  }
}

#if ETFUSE_HAVE_ARM_NEON
void depthwise_rows_neon(const Problem& pb, int64_t t0, int64_t t1);
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_rows_neon(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_rows<arm::DepthwiseNeon>(pb, t0, t1);
}
#endif
#endif  // ETFUSE_HAVE_ARM_NEON

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
