// etfuse::add.out: out = self + other, NumPy broadcasting, float32 (ops/elementwise.h).
#include "ops/elementwise.h"

namespace {

using namespace etfuse::adapter;

Tensor& add_out(Context& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary_out<etfuse::core::elementwise::Add>(ctx, "etfuse::add.out", self, other, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "add.out", add_out);
