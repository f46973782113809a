// etfuse::quantized_conv2d_packed.out: quantized_conv2d (groups 1) on int8 weight panels packed at
// fuse time (ops/quantized_gemm.h; gemm::Args::packed_b_i8).
#include "ops/quantized_gemm.h"

namespace {

using namespace etfuse::adapter;

Tensor& quantized_conv2d_packed_out(Context& ctx, const Tensor& input, double input_scale, int64_t input_zero_point,
                                    const Tensor& packed_weight, IntList weight_size, const Tensor& weight_scale,
                                    const OptTensor& bias, IntList stride, IntList padding, IntList dilation,
                                    double output_scale, int64_t output_zero_point, int64_t output_min,
                                    int64_t output_max, Tensor& out) {
  return quantized_gemm::conv2d_into(ctx, "etfuse::quantized_conv2d_packed.out", input, input_scale,
                                     input_zero_point, packed_weight, &weight_size, weight_scale, OptTensor(), bias,
                                     stride, padding, dilation, 1, output_scale, output_zero_point, output_min,
                                     output_max, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_conv2d_packed.out", quantized_conv2d_packed_out);
