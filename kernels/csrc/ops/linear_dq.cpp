// etfuse::linear_dq.out: act(quantize_per_token(input) @ dequantize(weight).T + bias + residual): the
// input's rows quantized to int8 once (torchao's per-token asymmetric steps), integer dot products
// with the int8 or packed 4-bit weight, the scales applied to the int32 sums (core/linear_dq.h).
// Arguments, residual and activation epilogue as linear_qw's (ops/quantized_weight_linear.h), and
// weight_row_sums (float32 [N], each dequantized weight row's sum: Args::row_sums).
#include "ops/quantized_weight_linear.h"
#include "core/linear_dq.h"

namespace {

using namespace etfuse::adapter;
namespace dq = etfuse::core::linear_dq;

Tensor& linear_dq_out(Context& ctx, const Tensor& input, const Tensor& weight, const Tensor& weight_row_sums,
                      const Tensor& scales, const OptTensor& zero_points, int64_t bits, const OptTensor& bias,
                      Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::linear_dq.out";
  Status st;
  Layout lr, lsc;
  // weight_row_sums: float32, one per weight row ([N]; the scales' first dimension)
  bool ok = contiguous_of(op, "weight_row_sums", weight_row_sums, ScalarType::Float, lr, st) &&
      layout_of(scales, "scales", lsc, st);
  if (ok && (lr.ndim != 1 || lsc.ndim < 1 || lr.sizes[0] != lsc.sizes[0])) {
    ok = st.fail("%s: weight_row_sums %s must be [N] for the scales %s", op, etfuse::core::ShapeStr(lr).c_str(),
                 etfuse::core::ShapeStr(lsc).c_str());
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  const float* row_sums = weight_row_sums.const_data_ptr<float>();
  return quantized_weight_linear_out(op, ctx, input, weight, scales, zero_points, bits, bias, activation, residual,
                                     out, [row_sums](const qw::Args& args) {
                                       qw::Args a = args;
                                       a.row_sums = row_sums;
                                       dq::Scratch scratch;
                                       dq::run(a, scratch, weight_stream_parallel(a));
                                     });
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_dq.out", linear_dq_out);
