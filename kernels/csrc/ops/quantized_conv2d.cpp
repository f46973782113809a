// etfuse::quantized_conv2d.out: int8/uint8 NCHW conv2d, integer accumulation on the float32 conv
// cores, requantized in the epilogue (ops/quantized_gemm.h).
#include "ops/quantized_gemm.h"

namespace {

using namespace etfuse::adapter;

Tensor& quantized_conv2d_out(Context& ctx, const Tensor& input, double input_scale, int64_t input_zero_point,
                             const Tensor& weight, const Tensor& weight_scale, const OptTensor& weight_zero_point,
                             const OptTensor& bias, IntList stride, IntList padding, IntList dilation, int64_t groups,
                             double output_scale, int64_t output_zero_point, int64_t output_min, int64_t output_max,
                             Tensor& out) {
  return quantized_gemm::conv2d_into(ctx, "etfuse::quantized_conv2d.out", input, input_scale, input_zero_point,
                                     weight, nullptr, weight_scale, weight_zero_point, bias, stride, padding, dilation,
                                     groups, output_scale, output_zero_point, output_min, output_max, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_conv2d.out", quantized_conv2d_out);
