// etfuse::linear_qw.out: act(input @ dequantize(weight).T + bias + residual) with an int8 or packed
// 4-bit weight dequantized in registers (core/linear_qw.h), then the activation (core/activation.h).
// The residual (a transformer's skip connection, out's shape) is added where the sums are stored.
// A gated activation (swiglu: silu(first half) * second half) halves out's features.
#include "ops/quantized_weight_linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& linear_qw_out(Context& ctx, const Tensor& input, const Tensor& weight, const Tensor& scales,
                      const OptTensor& zero_points, int64_t bits, const OptTensor& bias, Str activation,
                      const OptTensor& residual, Tensor& out) {
  return quantized_weight_linear_out("etfuse::linear_qw.out", ctx, input, weight, scales, zero_points, bits, bias,
                                     activation, residual, out, [](const qw::Args& a) {
                                       std::vector<float> xsum;
                                       qw::run(a, xsum, weight_stream_parallel(a));
                                     });
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_qw.out", linear_qw_out);
