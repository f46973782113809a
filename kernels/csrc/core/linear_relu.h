// etfuse::linear_relu.out core: out = relu(input @ weight.T + bias), float32.
//
// input [*, K] (its leading dims are the GEMM rows), weight [N, K] read as stored (the GEMM
// packs it as a transposed B, no transpose copy), bias [N] (or a single element) or none;
// out [*, N].
#pragma once

#include "common.h"
#include "gemm.h"

namespace etfuse {
namespace core {
namespace linear_relu {

inline bool out_shape(
    const Layout& in, const Layout& w, const Layout* bias, int& ndim, int64_t* sizes, Status& st) {
  if (in.ndim < 1) return st.fail("etfuse::linear_relu: input must have at least 1 dimension, got a 0-d tensor");
  if (w.ndim != 2) {
    return st.fail(
        "etfuse::linear_relu: weight must be 2-D [out_features, in_features], got shape %s", ShapeStr(w).c_str());
  }
  const int64_t K = in.size(-1), N = w.sizes[0];
  if (w.sizes[1] != K) {
    return st.fail(
        "etfuse::linear_relu: input shape %s and weight shape %s do not match (in_features %lld vs %lld)",
        ShapeStr(in).c_str(), ShapeStr(w).c_str(), (long long)K, (long long)w.sizes[1]);
  }
  if (bias) {
    const bool vec = bias->ndim == 1 && bias->sizes[0] == N;
    const bool one = bias->ndim <= 1 && bias->numel() == 1;
    if (!vec && !one) {
      return st.fail(
          "etfuse::linear_relu: bias must have shape [%lld] (out_features), got %s", (long long)N,
          ShapeStr(*bias).c_str());
    }
  }
  ndim = in.ndim;
  for (int d = 0; d < ndim; ++d) sizes[d] = in.sizes[d];
  sizes[ndim - 1] = N;
  return true;
}

// A [*, X] tensor as a matrix [M, X]: M and the row/column strides. False when the leading
// dims cannot be merged into one strided dim.
inline bool as_matrix(const Layout& t, int64_t& M, int64_t& rs, int64_t& cs) {
  cs = t.stride(-1);
  M = 1;
  rs = 0;
  int64_t next = -1;  // stride the next (outer) non-trivial dim must have
  for (int d = t.ndim - 2; d >= 0; --d) {
    M *= t.sizes[d];
    if (t.sizes[d] == 1) continue;
    if (next < 0) {
      rs = t.strides[d];
    } else if (t.strides[d] != next) {
      return false;
    }
    next = t.strides[d] * t.sizes[d];
  }
  return true;
}

// Fills the GEMM arguments. `out` must already have the shape from out_shape.
inline bool make_args(
    const float* in, const Layout& lin, const float* w, const Layout& lw, const float* bias, const Layout* lbias,
    float* out, const Layout& lout, gemm::Args& g, Status& st) {
  int64_t M = 0, Mo = 0;
  if (!as_matrix(lin, M, g.a_rs, g.a_cs)) {
    return st.fail(
        "etfuse::linear_relu: input of shape %s has leading dims that cannot be flattened (strides)",
        ShapeStr(lin).c_str());
  }
  if (!as_matrix(lout, Mo, g.c_rs, g.c_cs)) {
    return st.fail(
        "etfuse::linear_relu.out: out of shape %s has leading dims that cannot be flattened (strides)",
        ShapeStr(lout).c_str());
  }
  g.M = M;
  g.N = lw.sizes[0];
  g.K = lw.sizes[1];
  g.A = in;
  g.B = w;
  g.b_rs = lw.strides[1];  // B(k, j) = weight[j, k]
  g.b_cs = lw.strides[0];
  g.C = out;
  g.bias = bias;
  g.bias_rs = 0;
  g.bias_cs = (bias && lbias->ndim == 1 && lbias->sizes[0] != 1) ? lbias->strides[0] : 0;
  g.relu = true;
  return true;
}

template <class Par>
inline void run(const gemm::Args& g, Par&& par) {
  gemm::run(g, par);
}

}  // namespace linear_relu
}  // namespace core
}  // namespace etfuse
