// A small output map as the GEMM's dot-product path on the transposed problem over the image's
// im2col (run_small_map). run_paths takes it for the maps whose pixels fill the implicit GEMM's
// panels badly (small_map); im2col_rows serves run_packed too.
#pragma once

#include <vector>

#include "core/conv2d/common.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// A small output map (a network's last stages: 7x7, 6x6, 3x3, 1x1) whose pixels fill the
// implicit GEMM's NR-wide panels badly (9 of 16 columns on a 3x3 map with AVX2) runs as the
// GEMM's dot-product path on the transposed problem instead:
//   out^T[p, co] = sum_k cols[p, k] * weight[co, k]
// where cols is the im2col of the image, pixel by pixel (P x K floats, small). Both operands are
// contiguous along k and the weight is read once. Measured on AVX2 (GFLOP/s, dot vs panels):
// P=9 K=320 22.7 vs 17.3, P=36 K=384 24.6 vs 21.1, P=49 K=960 28.5 vs 25.4; full panels
// (P=16, 64) and short K stay with the panels (P=16 K=256 22.6 vs 32.9, P=36 K=64 12.2 vs 19.4).
constexpr int64_t kSmallMapPixels = 64;

inline bool small_map(int64_t pixels, int64_t K) {
  const int64_t nr = gemm::detail::kernels(selected_isa()).tiles.nr;
  const int64_t padded = (pixels + nr - 1) / nr * nr;
  const bool sparse = pixels * 5 <= padded * 4;  // at most 80% of the panel columns used
  return pixels <= kSmallMapPixels && sparse && (K >= 128 || pixels * 2 <= padded);
}

// cols[p, k] = input[ci, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw] (zero outside), with
// p = oh * OW + ow and k = (ci * KH + kh) * KW + kw.
inline void im2col_rows(const Problem& pb, const float* in, int64_t Cg, float* cols) {
  const Params& p = pb.p;
  const int64_t OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], H = pb.li.sizes[2], Wd = pb.li.sizes[3];
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = Cg * KH * KW;
  const int64_t hs = pb.li.strides[2], ws = pb.li.strides[3];
  // one k at a time, every pixel: the bounds are worked out once per (k, output row), not per
  // element (per element, this copy took longer than the GEMM after it on 5x5 maps)
  for (int64_t ci = 0; ci < Cg; ++ci) {
    const float* plane = in + ci * pb.li.strides[1];
    for (int64_t kh = 0; kh < KH; ++kh) {
      for (int64_t kw = 0; kw < KW; ++kw) {
        float* col = cols + (ci * KH + kh) * KW + kw;
        const int64_t iw0 = kw * p.dilation[1] - p.padding[1];
        int64_t lo, hi;
        valid_range(iw0, p.stride[1], Wd, OW, lo, hi);
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* dst = col + oh * OW * K;
          const int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
          if (ih < 0 || ih >= H) {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow * K] = 0.0f;
            continue;
          }
          const float* row = plane + ih * hs + iw0 * ws;
          const int64_t step = p.stride[1] * ws;
          for (int64_t ow = 0; ow < lo; ++ow) dst[ow * K] = 0.0f;
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow * K] = row[ow * step];
          for (int64_t ow = hi; ow < OW; ++ow) dst[ow * K] = 0.0f;
        }
      }
    }
  }
}

template <class Par>
inline void run_small_map(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], P = pb.lo.sizes[2] * pb.lo.sizes[3];
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = Cout / G;
  const int64_t K = Cg * pb.lw.sizes[2] * pb.lw.sizes[3];
  std::vector<float> cols(static_cast<size_t>(P * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      im2col_rows(pb, pb.in + n * pb.li.strides[0] + g * Cg * pb.li.strides[1], Cg, cols.data());
      gemm::Args a;
      a.M = P;
      a.N = Mg;
      a.K = K;
      a.A = cols.data();
      a.a_rs = K;
      a.a_cs = 1;
      a.B = pb.w + g * Mg * pb.lw.strides[0];  // B(k, co) = weight[co, k]
      a.b_rs = 1;
      a.b_cs = pb.lw.strides[0];
      channels_out(pb, n, g * Mg, true, a);
      a.dot = true;
      gemm::run(a, par);
    }
  }
}

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
