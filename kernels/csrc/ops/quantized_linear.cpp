// etfuse::quantized_linear.out: int8/uint8 [..., in] @ int8 weight [out, in].T, integer
// accumulation on the float32 GEMM, requantized in the epilogue (ops/quantized_gemm.h).
#include "ops/quantized_gemm.h"

namespace {

using namespace etfuse::adapter;

Tensor& quantized_linear_out(Context& ctx, const Tensor& input, double input_scale, int64_t input_zero_point,
                             const Tensor& weight, const Tensor& weight_scale, const OptTensor& weight_zero_point,
                             const OptTensor& bias, double output_scale, int64_t output_zero_point, int64_t output_min,
                             int64_t output_max, Tensor& out) {
  return quantized_gemm::linear_into(ctx, "etfuse::quantized_linear.out", input, input_scale, input_zero_point, weight,
                                     -1, weight_scale, weight_zero_point, bias, output_scale, output_zero_point,
                                     output_min, output_max, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_linear.out", quantized_linear_out);
