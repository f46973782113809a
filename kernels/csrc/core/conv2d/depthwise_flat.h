// A stride-1 depthwise conv with output rows as wide as its input rows, on flattened planes
// (depthwise_flat): every tap one contiguous multiply-add, the taps off a row's edge masked.
// run_paths takes it up to kFlatMaxPixels outputs (use_flat_depthwise).
#pragma once

#include <cstring>
#include <vector>

#include "core/conv2d/common.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// sums[q0, q0 + U * W) of depthwise_flat: `x` is the plane's copy at q0, tap (kh, kw) at
// x + kh * row + kw * dw; wl the weights [KH, KW]; mask / whole as in depthwise_flat.
template <int W, int U>
ETFUSE_ALWAYS_INLINE void flat_block(const float* x, int64_t KH, int64_t KW, int64_t row, int64_t dw,
                                     const float* wl, const int32_t* mask, int64_t mask_s, const char* whole,
                                     float seed, float lo, float hi, float* sums) {
  typedef typename gemm::detail::Vec<W>::type vf;
  typedef int32_t vi __attribute__((vector_size(W * 4)));
  vf acc[U];
  for (int u = 0; u < U; ++u) acc[u] = vf{} + seed;
  for (int64_t kw = 0; kw < KW; ++kw) {
    vf part[U] = {};
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* xr = x + kw * dw + kh * row;
      const float wv = wl[kh * KW + kw];
      for (int u = 0; u < U; ++u) {
        vf v;
        std::memcpy(&v, xr + u * W, sizeof(vf));
        part[u] += wv * v;
      }
    }
    if (whole[kw]) {
      for (int u = 0; u < U; ++u) acc[u] += part[u];
    } else {
      for (int u = 0; u < U; ++u) {
        vi m;
        std::memcpy(&m, mask + kw * mask_s + u * W, sizeof(vi));
        acc[u] = m ? acc[u] + part[u] : acc[u];
      }
    }
  }
  const vf vlo = vf{} + lo, vhi = vf{} + hi;
  for (int u = 0; u < U; ++u) {
    acc[u] = acc[u] < vlo ? vlo : (acc[u] > vhi ? vhi : acc[u]);  // clamp_act (NaN kept)
    gemm::detail::store<W>(sums + u * W, acc[u]);
  }
}

// A stride-1 depthwise conv whose output rows are as wide as its input rows (same padding along
// the width: 2 * pw == (KW - 1) * dw), on any map: the plane is flattened (q = oh * W + ow) and
// every tap is one contiguous multiply-add at the constant offset (kh * dh - ph) * W + kw * dw - pw,
// with no per-row copies or dropped columns (direct_planes pays both; on DS-CNN's 25x5 maps, 5
// floats a row, they cost more than the multiply-adds). A read off a row's left or right edge
// lands on the neighbouring row, so the taps of each kernel column are summed apart and added
// only in the lanes where that column is inside the row (a select, not a multiply by 0: an inf
// next door stays out). The rows above and below are the zero rows around the plane's one-memcpy
// copy. One plane per task.
template <int W>
ETFUSE_ALWAYS_INLINE void depthwise_flat(const Problem& pb, int64_t t0, int64_t t1) {
  constexpr int64_t slack = 4 * W;  // the last block's over-read and over-write
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], P = OH * OW;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const int64_t LP = (P + W - 1) / W * W, A = ph * Wd + pw;  // A: where the plane starts in `buf`
  int64_t size = LP + slack + (KH - 1) * dh * Wd + (KW - 1) * dw;  // past the last tap read
  if (size < A + H * Wd) size = A + H * Wd;
  std::vector<float> buf(static_cast<size_t>(size), 0.0f), sums(static_cast<size_t>(LP + slack));
  std::vector<float> wl(static_cast<size_t>(KH * KW));
  // mask[kw][q]: -1 where output column q % OW reads inside its row at kernel column kw. Periodic
  // in q with period W * OW, a multiple of the vector width: a block at q0 reads it from
  // q0 % (W * OW), so one period and a block's length are enough.
  const int64_t period = W * OW, mask_s = period + slack;
  std::vector<int32_t> mask(static_cast<size_t>(KW * mask_s));
  std::vector<char> whole(static_cast<size_t>(KW));  // column kw inside the row for every ow
  for (int64_t kw = 0; kw < KW; ++kw) {
    const int64_t shift = kw * dw - pw;
    whole[kw] = shift >= 0 && shift + OW <= Wd;
    int32_t* m = mask.data() + kw * mask_s;
    for (int64_t q = 0, ow = 0; q < mask_s; ++q) {
      m[q] = ow + shift >= 0 && ow + shift < Wd ? -1 : 0;
      if (++ow == OW) ow = 0;
    }
  }
  const bool flat_in = pb.li.strides[3] == 1 && pb.li.strides[2] == Wd;
  const bool flat_out = pb.lo.strides[3] == 1 && pb.lo.strides[2] == OW;
  const bool flat_w = pb.lw.strides[3] == 1 && pb.lw.strides[2] == KW;  // a channel's taps contiguous
  // Blocks of 4 vectors, the last 1-3 as one block of 2 or 4 (into the slack). The blocks that
  // end inside a flat output plane are written straight into it: [0, in_place); the rest go
  // through `sums` and are copied.
  const auto block_len = [&](int64_t q0) { return LP - q0 > 2 * W ? 4 * W : 2 * W; };
  int64_t in_place = 0;
  while (flat_out && in_place < LP && in_place + block_len(in_place) <= P) in_place += block_len(in_place);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / C, c = t % C;
    const float* src = pb.in + n * pb.li.strides[0] + c * pb.li.strides[1];
    float* dst = pb.out + n * pb.lo.strides[0] + c * pb.lo.strides[1];
    if (flat_in) {
      copy_row<W>(buf.data() + A, src, H * Wd);  // inline: a libc call per small plane was 12% of a 6x6 map's time
    } else {
      for (int64_t ih = 0; ih < H; ++ih)
        for (int64_t iw = 0; iw < Wd; ++iw) buf[A + ih * Wd + iw] = src[ih * pb.li.strides[2] + iw * pb.li.strides[3]];
    }
    // the per-channel scale folded into the weights, the bias as the sums' seed (as direct_planes)
    const float s = pb.scale ? pb.scale[c * pb.scale_s] : 1.0f;
    const float* wk = pb.w + c * pb.lw.strides[0];
    if (flat_w) {  // one short loop GCC unrolls (with the strides it was 14% of a 6x6 map's time)
      for (int64_t k = 0; k < KH * KW; ++k) wl[k] = wk[k] * s;
    } else {
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) wl[kh * KW + kw] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
    }
    const float seed = pb.bias ? pb.bias[c * pb.bias_s] : 0.0f;
    for (int64_t q0 = 0; q0 < LP;) {
      const float* x = buf.data() + q0;  // tap (kh, kw) at x + kh * dh * Wd + kw * dw (A folded in)
      const int64_t len = block_len(q0);
      float* to = q0 < in_place ? dst : sums.data();
      if (len == 4 * W) {
        flat_block<W, 4>(x, KH, KW, dh * Wd, dw, wl.data(), mask.data() + q0 % period, mask_s, whole.data(), seed, lo_v, hi_v,
                         to + q0);
      } else {
        flat_block<W, 2>(x, KH, KW, dh * Wd, dw, wl.data(), mask.data() + q0 % period, mask_s, whole.data(), seed, lo_v, hi_v,
                         to + q0);
      }
      q0 += len;
    }
    if (flat_out) {
      copy_row<W>(dst + in_place, sums.data() + in_place, P - in_place);
    } else {
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) dst[oh * pb.lo.strides[2] + ow * pb.lo.strides[3]] = sums[oh * OW + ow];
    }
  }
}

// Compiled once per library in core/kernels.cpp.
void depthwise_flat_baseline(const Problem& pb, int64_t t0, int64_t t1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_flat_avx2(const Problem& pb, int64_t t0, int64_t t1);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_flat_baseline(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_flat<4>(pb, t0, t1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_flat_avx2(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_flat<8>(pb, t0, t1);
}
#endif
#endif

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
