// The one GEMM entry of the float ops: linear (input @ weight.T + bias) and addmm
// (self + mat1 @ mat2), each followed by the clamp epilogue of gemm.h. linear_relu and
// addmm_relu are the clamp [0, inf), linear_act any [min, max] or none.
//
// linear: input [*, K] (its leading dims are the GEMM rows), weight [N, K] read as stored (the
// GEMM packs it as a transposed B, no transpose copy), bias [N] (or a single element) or none;
// out [*, N]. addmm: mat1 [M, K], mat2 [K, N] (any strides), self broadcastable to [M, N]
// ([N], [1, N], [M, 1], [M, N], a scalar) read with broadcast strides in the epilogue.
// The messages name linear_relu / addmm_relu, the ops these shapes were first written for.
#pragma once

#include "common.h"
#include "gemm.h"

namespace etfuse {
namespace core {
namespace gemm_entry {

// The epilogue's clamp: [lo, hi], or none.
struct Clamp {
  bool on = true;
  float lo = 0.0f, hi = __builtin_inff();
  static Clamp relu() { return Clamp{}; }
  // min/max may each be absent (has_*): -inf / +inf; neither: no clamp.
  static Clamp between(bool has_min, float min, bool has_max, float max) {
    Clamp c;
    c.on = has_min || has_max;
    c.lo = has_min ? min : -__builtin_inff();
    c.hi = has_max ? max : __builtin_inff();
    return c;
  }
};

inline void set_clamp(gemm::Args& g, const Clamp& c) {
  g.clamp = c.on;
  g.act_min = c.lo;
  g.act_max = c.hi;
}


inline bool linear_out_shape(
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

// linear_packed_act's weight: pack_gemm_weight(weight) (gemm::Args::packed_b), [ceil(N / kPanel), K, kPanel]
// contiguous, for N = out_features. Fills `logical`, the [N, K] weight it stands for (whose
// strides are unused: the GEMM reads the panels).
inline bool packed_weight(const Layout& pw, int64_t N, Layout& logical, Status& st,
                          const char* op = "etfuse::linear_packed_act") {
  const int64_t P = gemm::kPanel;
  if (pw.ndim != 3 || pw.sizes[2] != P || N < 0 || pw.sizes[0] != gemm::packed_panels(N)) {
    return st.fail(
        "%s: packed_weight must have shape [%lld, in_features, %lld] for out_features %lld "
        "(etfuse.passes.PrepackWeightsPass packs it), got %s",
        op, (long long)gemm::packed_panels(N), (long long)P, (long long)N, ShapeStr(pw).c_str());
  }
  const int64_t K = pw.sizes[1];
  if (pw.numel() > 0 && (pw.strides[2] != 1 || pw.strides[1] != P || pw.strides[0] != K * P)) {
    return st.fail("%s: packed_weight must be contiguous, got strides of %s", op, ShapeStr(pw).c_str());
  }
  logical.ndim = 2;
  logical.sizes[0] = N;
  logical.sizes[1] = K;
  logical.strides[0] = K;
  logical.strides[1] = 1;
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
inline bool linear_args(
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
  return true;
}



inline bool addmm_out_shape(
    const Layout& self, const Layout& m1, const Layout& m2, int& ndim, int64_t* sizes, Status& st) {
  if (m1.ndim != 2 || m2.ndim != 2) {
    return st.fail(
        "etfuse::addmm_relu: mat1 and mat2 must be 2-D, got shapes %s and %s", ShapeStr(m1).c_str(),
        ShapeStr(m2).c_str());
  }
  if (m1.sizes[1] != m2.sizes[0]) {
    return st.fail(
        "etfuse::addmm_relu: mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
        (long long)m1.sizes[0], (long long)m1.sizes[1], (long long)m2.sizes[0], (long long)m2.sizes[1]);
  }
  ndim = 2;
  sizes[0] = m1.sizes[0];
  sizes[1] = m2.sizes[1];
  bool ok = self.ndim <= 2;
  for (int d = 0; ok && d < self.ndim; ++d) {
    const int64_t s = self.sizes[d], want = sizes[2 - self.ndim + d];
    ok = s == want || s == 1;
  }
  if (!ok) {
    return st.fail(
        "etfuse::addmm_relu: self of shape %s cannot be broadcast to the product's shape %s",
        ShapeStr(self).c_str(), ShapeStr(sizes, 2).c_str());
  }
  return true;
}

inline bool addmm_args(
    const float* self, const Layout& ls, const float* m1, const Layout& l1, const float* m2, const Layout& l2,
    float* out, const Layout& lout, gemm::Args& g, Status& st) {
  if (lout.ndim != 2) return st.fail("etfuse::addmm_relu.out: out must be 2-D, got %s", ShapeStr(lout).c_str());
  g.M = l1.sizes[0];
  g.K = l1.sizes[1];
  g.N = l2.sizes[1];
  g.A = m1;
  g.a_rs = l1.strides[0];
  g.a_cs = l1.strides[1];
  g.B = m2;
  g.b_rs = l2.strides[0];
  g.b_cs = l2.strides[1];
  g.C = out;
  g.c_rs = lout.strides[0];
  g.c_cs = lout.strides[1];
  g.bias = self;
  g.bias_rs = broadcast_stride(ls, 2, 0);
  g.bias_cs = broadcast_stride(ls, 2, 1);
  return true;
}


template <class Par>
inline void run(gemm::Args g, const Clamp& c, Par&& par) {
  set_clamp(g, c);
  gemm::run(g, par);
}

}  // namespace gemm_entry
}  // namespace core
}  // namespace etfuse
