// A weight packed at fuse time (conv2d_packed_act, quantized_conv2d_packed): the transposed
// problem on the GEMM's tiles, the packed weight read in place (run_packed). run_paths takes it
// first, whenever Problem::packed or packed_i8 is set.
#pragma once

#include <vector>

#include "core/conv2d/common.h"
#include "core/conv2d/small_map.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// A weight packed at fuse time (groups 1): the transposed problem on the GEMM's tiles with the
// packed weight as B, read in place,
//   out^T[p, co] = sum_k cols[p, k] * weight[co, k]
// where cols is the input itself for a 1x1, stride-1, unpadded conv on a flat plane (read
// through its strides: A(p, ci) = input[ci, p]), the image's im2col otherwise. Nothing of the
// weight is copied per call: the per-call packing of the other paths is what makes a small map's
// 1x1 conv slow there (MobileNetV2's 160 -> 960 on 3x3).
template <class Par>
inline void run_packed(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], P = pb.lo.sizes[2] * pb.lo.sizes[3];
  const int64_t C = pb.li.sizes[1], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = C * KH * KW;
  const bool in_place = KH == 1 && KW == 1 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 0 &&
      p.padding[1] == 0 && (pb.li.sizes[2] <= 1 || pb.li.strides[2] == pb.li.sizes[3] * pb.li.strides[3]);
  std::vector<float> cols(in_place ? 0 : static_cast<size_t>(P * K));
  for (int64_t n = 0; n < N; ++n) {
    const float* in = pb.in + n * pb.li.strides[0];
    gemm::Args a;
    a.M = P;
    a.N = Cout;
    a.K = K;
    if (in_place) {
      a.A = in;
      a.a_rs = pb.li.strides[3];
      a.a_cs = pb.li.strides[1];
    } else {
      im2col_rows(pb, in, C, cols.data());
      a.A = cols.data();
      a.a_rs = K;
      a.a_cs = 1;
    }
    a.packed_b = pb.packed;
    a.packed_b_i8 = pb.packed_i8;
    channels_out(pb, n, 0, true, a);
    gemm::run(a, par);
  }
}

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
