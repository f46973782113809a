// The broadcast iterator of every element-wise core (add_relu, the quantized add family).
//
// Two operands and an output, each a strided Layout. The iteration space is simplified once:
// size-1 output dims are dropped and adjacent dims merged where every operand's strides allow,
// so the common cases become one flat run (same-shape contiguous operands), a contiguous
// inner run against a broadcast row ([N] against [M, N]) or a broadcast scalar in the inner
// run ([M, 1]). The rest walks the remaining dims with a counter. Work is split over flat
// output elements. etfuse/kernels/triton/launch.py `broadcast_plan` follows the same rules
// (tests/test_kernels.py compares the two).
#pragma once

#include "common.h"

namespace etfuse {
namespace core {
namespace broadcast {

// Simplified iteration space; dim 0 is the innermost. Strides in elements (0: broadcast).
struct Plan {
  int n = 0;
  int64_t sz[kMaxDims];
  int64_t sa[kMaxDims], sb[kMaxDims], so[kMaxDims];
  int64_t total = 0;
};

inline Plan make_plan(const Layout& la, const Layout& lb, const Layout& lo) {
  Plan p;
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

// `out` (already resized by the caller) has the broadcast shape of a and b.
inline bool check_out(const char* op, const Layout& a, const Layout& b, const Layout& out, Status& st) {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  if (!broadcast_shapes(a, b, ndim, sizes, op, st)) return false;
  bool same = ndim == out.ndim;
  for (int d = 0; same && d < ndim; ++d) same = sizes[d] == out.sizes[d];
  if (!same) {
    return st.fail("%s: out has shape %s, expected %s", op, ShapeStr(out).c_str(), ShapeStr(sizes, ndim).c_str());
  }
  return true;
}

// Flat output elements [e0, e1) of the plan as inner runs:
// run(len, a_offset, a_stride, b_offset, b_stride, out_offset, out_stride), offsets in elements.
// Always inlined, so a caller compiled for AVX2 gets `run` (a struct's inline operator())
// compiled for AVX2 too.
template <class Run>
ETFUSE_ALWAYS_INLINE void for_range(const Plan& p, int64_t e0, int64_t e1, Run&& run) {
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
    run(len, oa + col * p.sa[0], p.sa[0], ob + col * p.sb[0], p.sb[0], oo + col * p.so[0], p.so[0]);
    remaining -= len;
    col = 0;
    for (int d = 1; d < p.n; ++d) {
      oa += p.sa[d];
      ob += p.sb[d];
      oo += p.so[d];
      if (++idx[d] < p.sz[d]) break;
      oa -= p.sa[d] * p.sz[d];
      ob -= p.sb[d] * p.sz[d];
      oo -= p.so[d] * p.sz[d];
      idx[d] = 0;
    }
  }
}

}  // namespace broadcast
}  // namespace core
}  // namespace etfuse
