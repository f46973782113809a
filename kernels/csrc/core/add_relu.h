// etfuse::add_relu.out core: out = relu(self + other), NumPy broadcasting, float32.
//
// The three tensors are described by strided layouts. The broadcast iteration space is
// simplified once (size-1 dims dropped, adjacent dims merged where every operand's strides
// allow), so the common cases become a single flat loop: same-shape contiguous operands are
// one contiguous run; a trailing-broadcast operand ([N] against [M, N]) is a contiguous inner
// run; a scalar or [M, 1] operand is a broadcast scalar in the inner run. Everything else
// walks the remaining dims with a counter. Work is split over flat output elements.
#pragma once

#include "common.h"

namespace etfuse {
namespace core {
namespace add_relu {

// Output shape of add_relu(a, b): the broadcast of both shapes.
inline bool out_shape(const Layout& a, const Layout& b, int& ndim, int64_t* sizes, Status& st) {
  return broadcast_shapes(a, b, ndim, sizes, "etfuse::add_relu", st);
}

// Validates `out` (already resized by the caller) against the inputs.
inline bool check_out(const Layout& a, const Layout& b, const Layout& out, Status& st) {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  if (!out_shape(a, b, ndim, sizes, st)) return false;
  bool same = ndim == out.ndim;
  for (int d = 0; same && d < ndim; ++d) same = sizes[d] == out.sizes[d];
  if (!same) {
    return st.fail(
        "etfuse::add_relu.out: out has shape %s, expected %s", ShapeStr(out).c_str(),
        ShapeStr(sizes, ndim).c_str());
  }
  return true;
}

namespace detail {

// Simplified iteration space; dim 0 is the innermost.
struct Plan {
  int n = 0;
  int64_t sz[kMaxDims];
  int64_t sa[kMaxDims], sb[kMaxDims], so[kMaxDims];
  int64_t total = 0;
  const float* a = nullptr;
  const float* b = nullptr;
  float* o = nullptr;
};

inline Plan make_plan(
    const float* a, const Layout& la, const float* b, const Layout& lb, float* o, const Layout& lo) {
  Plan p;
  p.a = a;
  p.b = b;
  p.o = o;
  p.total = lo.numel();
  for (int d = lo.ndim - 1; d >= 0; --d) {
    const int64_t size = lo.sizes[d];
    if (size == 1) continue;
    const int64_t sa = broadcast_stride(la, lo.ndim, d);
    const int64_t sb = broadcast_stride(lb, lo.ndim, d);
    const int64_t so = lo.strides[d];
    if (p.n > 0) {
      const int i = p.n - 1;
      if (sa == p.sa[i] * p.sz[i] && sb == p.sb[i] * p.sz[i] && so == p.so[i] * p.sz[i]) {
        p.sz[i] *= size;  // merge into the inner dim
        continue;
      }
    }
    p.sz[p.n] = size;
    p.sa[p.n] = sa;
    p.sb[p.n] = sb;
    p.so[p.n] = so;
    ++p.n;
  }
  if (p.n == 0) {  // one element
    p.n = 1;
    p.sz[0] = 1;
    p.sa[0] = p.sb[0] = p.so[0] = 0;
  }
  return p;
}

ETFUSE_ALWAYS_INLINE void inner(
    int64_t len, const float* a, int64_t ia, const float* b, int64_t ib, float* o, int64_t io) {
  if (io == 1) {
    if (ia == 1 && ib == 1) {
      for (int64_t i = 0; i < len; ++i) o[i] = relu(a[i] + b[i]);
      return;
    }
    if (ia == 1 && ib == 0) {
      const float s = *b;
      for (int64_t i = 0; i < len; ++i) o[i] = relu(a[i] + s);
      return;
    }
    if (ia == 0 && ib == 1) {
      const float s = *a;
      for (int64_t i = 0; i < len; ++i) o[i] = relu(s + b[i]);
      return;
    }
  }
  for (int64_t i = 0; i < len; ++i) o[i * io] = relu(a[i * ia] + b[i * ib]);
}

// Flat output elements [e0, e1) of the plan.
ETFUSE_ALWAYS_INLINE void run_range_impl(const Plan& p, int64_t e0, int64_t e1) {
  const int64_t L = p.sz[0];
  int64_t idx[kMaxDims];
  int64_t row = e0 / L, col = e0 % L;
  int64_t oa = 0, ob = 0, oo = 0;
  for (int d = 1; d < p.n; ++d) {
    idx[d] = row % p.sz[d];
    row /= p.sz[d];
    oa += idx[d] * p.sa[d];
    ob += idx[d] * p.sb[d];
    oo += idx[d] * p.so[d];
  }
  int64_t remaining = e1 - e0;
  while (remaining > 0) {
    const int64_t len = (L - col) < remaining ? (L - col) : remaining;
    inner(
        len, p.a + oa + col * p.sa[0], p.sa[0], p.b + ob + col * p.sb[0], p.sb[0],
        p.o + oo + col * p.so[0], p.so[0]);
    remaining -= len;
    col = 0;
    for (int d = 1; d < p.n; ++d) {
      ++idx[d];
      oa += p.sa[d];
      ob += p.sb[d];
      oo += p.so[d];
      if (idx[d] < p.sz[d]) break;
      oa -= p.sa[d] * p.sz[d];
      ob -= p.sb[d] * p.sz[d];
      oo -= p.so[d] * p.sz[d];
      idx[d] = 0;
    }
  }
}

inline void run_range_baseline(const Plan& p, int64_t e0, int64_t e1) {
  run_range_impl(p, e0, e1);
}
ETFUSE_TARGET_AVX2 inline void run_range_avx2(const Plan& p, int64_t e0, int64_t e1) {
  run_range_impl(p, e0, e1);
}

}  // namespace detail

// out = relu(a + b). `lo` must be the broadcast shape of `la` and `lb` (see check_out).
template <class Par>
inline void run(
    const float* a, const Layout& la, const float* b, const Layout& lb, float* out, const Layout& lo,
    Par&& par) {
  const detail::Plan p = detail::make_plan(a, la, b, lb, out, lo);
  if (p.total == 0) return;
  auto* fn = selected_isa() == Isa::kAvx2 ? &detail::run_range_avx2 : &detail::run_range_baseline;
  for_elements(p.total, par, [&](int64_t begin, int64_t end) { fn(p, begin, end); });
}

}  // namespace add_relu
}  // namespace core
}  // namespace etfuse
