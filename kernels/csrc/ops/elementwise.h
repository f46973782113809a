// The element-wise binary ops' shared body (add_relu.cpp, mul.cpp): validate, broadcast,
// resize, run the core (core/elementwise.h) with the op's functor F. Included by op files only.
#pragma once

#include "adapter.h"
#include "core/elementwise.h"

namespace etfuse {
namespace adapter {

template <class F>
inline Tensor& binary_out(Context& ctx, const char* op, const Tensor& self, const Tensor& other, Tensor& out) {
  namespace ew = core::elementwise;
  Status st;
  Layout la, lb;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  const bool ok = check_float(op, "self", self, st) && check_float(op, "other", other, st) &&
      check_float(op, "out", out, st) && layout_of(self, "self", la, st) && layout_of(other, "other", lb, st) &&
      ew::out_shape<F>(la, lb, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      ew::check_out(op, la, lb, o.layout(), st) && o.open({&self, &other}, true, true, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  ew::run<F>(self.const_data_ptr<float>(), la, other.const_data_ptr<float>(), lb, o.data<float>(), o.write_layout(),
             Parallel{});
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
