// etfuse::addmm_relu.out core: out = relu(self + mat1 @ mat2), float32.
//
// mat1 [M, K], mat2 [K, N] (any strides), self broadcastable to [M, N] ([N], [1, N], [M, 1],
// [M, N], a scalar) and read with broadcast strides in the GEMM epilogue; out [M, N].
#pragma once

#include "common.h"
#include "gemm.h"

namespace etfuse {
namespace core {
namespace addmm_relu {

inline bool out_shape(
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

inline bool make_args(
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
  g.relu = true;
  return true;
}

template <class Par>
inline void run(const gemm::Args& g, Par&& par) {
  gemm::run(g, par);
}

}  // namespace addmm_relu
}  // namespace core
}  // namespace etfuse
