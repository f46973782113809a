// etfuse::linear_relu.out: relu(input @ weight.T + bias): the GEMM entry with the clamp [0, inf).
#include "ops/linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& linear_relu_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias, Tensor& out) {
  return linear_into(ctx, "etfuse::linear_relu.out", input, weight, bias, etfuse::core::gemm_entry::Clamp::relu(),
                     etfuse::core::activation::Kind::kNone, true,
                     out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_relu.out", linear_relu_out);
