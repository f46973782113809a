// The float32 element-wise binary cores, NumPy broadcasting:
//   etfuse::add_relu.out: out = relu(self + other)
//   etfuse::mul.out:      out = self * other
//   etfuse::add.out:      out = self + other
//
// The three tensors are strided layouts walked by the shared broadcast iterator (broadcast.h);
// an op is a functor `F::apply(a, b)` and its name, the loops are shared.
#pragma once

#include "broadcast.h"
#include "common.h"

namespace etfuse {
namespace core {
namespace elementwise {

struct AddRelu {
  static constexpr const char* name = "etfuse::add_relu";
  ETFUSE_ALWAYS_INLINE static float apply(float a, float b) { return relu(a + b); }
};

struct Mul {
  static constexpr const char* name = "etfuse::mul";
  ETFUSE_ALWAYS_INLINE static float apply(float a, float b) { return a * b; }
};

struct Add {
  static constexpr const char* name = "etfuse::add";
  ETFUSE_ALWAYS_INLINE static float apply(float a, float b) { return a + b; }
};

// Output shape of F(a, b): the broadcast of both shapes.
template <class F>
inline bool out_shape(const Layout& a, const Layout& b, int& ndim, int64_t* sizes, Status& st) {
  return broadcast_shapes(a, b, ndim, sizes, F::name, st);
}

// Validates `out` (already resized by the caller) against the inputs; `op` names the out variant.
inline bool check_out(const char* op, const Layout& a, const Layout& b, const Layout& out, Status& st) {
  return broadcast::check_out(op, a, b, out, st);
}

namespace detail {

template <class F>
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
        for (int64_t i = 0; i < len; ++i) po[i] = F::apply(pa[i], pb[i]);
        return;
      }
      if (ia == 1 && ib == 0) {  // e.g. a squeeze-excite scale: one value per channel plane
        const float s = *pb;
        for (int64_t i = 0; i < len; ++i) po[i] = F::apply(pa[i], s);
        return;
      }
      if (ia == 0 && ib == 1) {
        const float s = *pa;
        for (int64_t i = 0; i < len; ++i) po[i] = F::apply(s, pb[i]);
        return;
      }
    }
    for (int64_t i = 0; i < len; ++i) po[i * io] = F::apply(pa[i * ia], pb[i * ib]);
  }
};

template <class F>
inline void run_range_baseline(const broadcast::Plan& p, const Inner<F>& in, int64_t e0, int64_t e1) {
  broadcast::for_range(p, e0, e1, in);
}
#if ETFUSE_HAVE_X86_DISPATCH
template <class F>
ETFUSE_TARGET_AVX2 inline void run_range_avx2(const broadcast::Plan& p, const Inner<F>& in, int64_t e0, int64_t e1) {
  broadcast::for_range(p, e0, e1, in);
}
#endif

// F's kernel on one ISA: the one place it is chosen. aarch64 runs the portable loop (the
// compiler's NEON vectorisation of it).
template <class F>
struct Kernels {
  void (*range)(const broadcast::Plan&, const Inner<F>&, int64_t, int64_t);
};

template <class F>
inline Kernels<F> kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&run_range_avx2<F>};
#endif
    default: return {&run_range_baseline<F>};
  }
}

}  // namespace detail

// out = F(a, b). `lo` must be the broadcast shape of `la` and `lb` (see check_out).
template <class F, class Par>
inline void run(
    const float* a, const Layout& la, const float* b, const Layout& lb, float* out, const Layout& lo,
    Par&& par) {
  const broadcast::Plan p = broadcast::make_plan(la, lb, lo);
  if (p.total == 0) return;
  const detail::Inner<F> in{a, b, out};
  const auto fn = detail::kernels<F>(selected_isa()).range;
  for_elements(p.total, par, [&](int64_t begin, int64_t end) { fn(p, in, begin, end); });
}

}  // namespace elementwise
}  // namespace core
}  // namespace etfuse
