// The skip connection added after the paths that do not add Problem::residual in their
// epilogue (the direct and depthwise kernels, adds_residual); `run` calls it.
#pragma once

#include "core/conv2d/common.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// out = clamp(out + residual) element by element, for the paths that do not add the residual in
// their epilogue (adds_residual): a skip connection around a depthwise conv, or any conv on the
// SSE2 baseline's direct kernel. The conv ran without its clamp.
inline void add_residual(const Problem& pb) {
  const Params& p = pb.p;
  float lo, hi;
  clamp_bounds(p, lo, hi);
  const Layout& l = pb.lo;
  for (int64_t n = 0; n < l.sizes[0]; ++n) {
    for (int64_t c = 0; c < l.sizes[1]; ++c) {
      for (int64_t h = 0; h < l.sizes[2]; ++h) {
        const int64_t at = n * l.strides[0] + c * l.strides[1] + h * l.strides[2];
        float* o = pb.out + at;
        const float* r = pb.residual + at;
        for (int64_t w = 0, ws = l.strides[3]; w < l.sizes[3]; ++w) o[w * ws] = gemm::clamp_act(o[w * ws] + r[w * ws], lo, hi);
      }
    }
  }
}

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
