// etfuse::linear_dq.out: act(quantize_per_token(input) @ dequantize(weight).T + bias + residual): the
// input's rows quantized to int8 once (torchao's per-token asymmetric steps), integer dot products
// with the int8 or packed 4-bit weight, the scales applied to the int32 sums (core/linear_dq.h).
// Arguments, residual and activation epilogue as linear_qw's (ops/quantized_weight_linear.h).
#include "ops/quantized_weight_linear.h"
#include "core/linear_dq.h"

namespace {

using namespace etfuse::adapter;
namespace dq = etfuse::core::linear_dq;

Tensor& linear_dq_out(Context& ctx, const Tensor& input, const Tensor& weight, const Tensor& scales,
                      const OptTensor& zero_points, int64_t bits, const OptTensor& bias, Str activation,
                      const OptTensor& residual, Tensor& out) {
  return quantized_weight_linear_out("etfuse::linear_dq.out", ctx, input, weight, scales, zero_points, bits, bias,
                                     activation, residual, out, [](const qw::Args& a) {
                                       dq::Scratch scratch;
                                       dq::run(a, scratch, Parallel{});
                                     });
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_dq.out", linear_dq_out);
