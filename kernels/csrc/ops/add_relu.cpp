// etfuse::add_relu.out: out = relu(self + other), NumPy broadcasting, float32 (core/add_relu.h).
#include "adapter.h"
#include "core/add_relu.h"

namespace {

using namespace etfuse::adapter;
namespace core = etfuse::core;

Tensor& add_relu_out(Context& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  constexpr const char* op = "etfuse::add_relu.out";
  Status st;
  Layout la, lb;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  const bool ok = check_float(op, "self", self, st) && check_float(op, "other", other, st) &&
      check_float(op, "out", out, st) && layout_of(self, "self", la, st) && layout_of(other, "other", lb, st) &&
      core::add_relu::out_shape(la, lb, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      core::add_relu::check_out(la, lb, o.layout(), st) && o.open({&self, &other}, true, true, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  core::add_relu::run(self.const_data_ptr<float>(), la, other.const_data_ptr<float>(), lb, o.data<float>(),
                      o.write_layout(), Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "add_relu.out", add_relu_out);
