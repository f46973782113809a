// etfuse::add_relu.out core: out = relu(self + other), NumPy broadcasting, float32.
//
// The three tensors are strided layouts walked by the shared broadcast iterator (broadcast.h).
#pragma once

#include "broadcast.h"
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
  return broadcast::check_out("etfuse::add_relu.out", a, b, out, st);
}

namespace detail {

struct Inner {
  const float* a;
  const float* b;
  float* o;
  ETFUSE_ALWAYS_INLINE void operator()(
      int64_t len, int64_t oa, int64_t ia, int64_t ob, int64_t ib, int64_t oo, int64_t io) const {
    const float* pa = a + oa;
    const float* pb = b + ob;
    float* po = o + oo;
    if (io == 1) {
      if (ia == 1 && ib == 1) {
        for (int64_t i = 0; i < len; ++i) po[i] = relu(pa[i] + pb[i]);
        return;
      }
      if (ia == 1 && ib == 0) {
        const float s = *pb;
        for (int64_t i = 0; i < len; ++i) po[i] = relu(pa[i] + s);
        return;
      }
      if (ia == 0 && ib == 1) {
        const float s = *pa;
        for (int64_t i = 0; i < len; ++i) po[i] = relu(s + pb[i]);
        return;
      }
    }
    for (int64_t i = 0; i < len; ++i) po[i * io] = relu(pa[i * ia] + pb[i * ib]);
  }
};

inline void run_range_baseline(const broadcast::Plan& p, const Inner& in, int64_t e0, int64_t e1) {
  broadcast::for_range(p, e0, e1, in);
}
ETFUSE_TARGET_AVX2 inline void run_range_avx2(const broadcast::Plan& p, const Inner& in, int64_t e0, int64_t e1) {
  broadcast::for_range(p, e0, e1, in);
}

}  // namespace detail

// out = relu(a + b). `lo` must be the broadcast shape of `la` and `lb` (see check_out).
template <class Par>
inline void run(
    const float* a, const Layout& la, const float* b, const Layout& lb, float* out, const Layout& lo,
    Par&& par) {
  const broadcast::Plan p = broadcast::make_plan(la, lb, lo);
  if (p.total == 0) return;
  const detail::Inner in{a, b, out};
  auto* fn = selected_isa() == Isa::kAvx2 ? &detail::run_range_avx2 : &detail::run_range_baseline;
  for_elements(p.total, par, [&](int64_t begin, int64_t end) { fn(p, in, begin, end); });
}

}  // namespace add_relu
}  // namespace core
}  // namespace etfuse
