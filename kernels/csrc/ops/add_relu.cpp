// etfuse::add_relu.out: out = relu(self + other), NumPy broadcasting, float32 (ops/elementwise.h).
#include "ops/elementwise.h"

namespace {

using namespace etfuse::adapter;

Tensor& add_relu_out(Context& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary_out<etfuse::core::elementwise::AddRelu>(ctx, "etfuse::add_relu.out", self, other, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "add_relu.out", add_relu_out);
