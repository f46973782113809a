// etfuse::mul.out: out = self * other, NumPy broadcasting, float32 (ops/elementwise.h).
#include "ops/elementwise.h"

namespace {

using namespace etfuse::adapter;

Tensor& mul_out(Context& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary_out<etfuse::core::elementwise::Mul>(ctx, "etfuse::mul.out", self, other, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "mul.out", mul_out);
