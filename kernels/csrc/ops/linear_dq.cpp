// etfuse::linear_dq.out: act(quantize_per_token(input) @ dequantize(weight).T + bias + residual): the
// input's rows quantized to int8 once (torchao's per-token asymmetric steps), integer dot products
// with the int8 or packed 4-bit weight, the scales applied to the int32 sums (core/linear_dq.h).
// Arguments, residual and activation epilogue as linear_qw's (ops/quantized_weight_linear.h), and
// weight_sums (int32 [N, groups], group_sums of the weight's q: Args::wsum).
#include "ops/quantized_weight_linear.h"
#include "core/linear_dq.h"

namespace {

using namespace etfuse::adapter;
namespace dq = etfuse::core::linear_dq;

Tensor& linear_dq_out(Context& ctx, const Tensor& input, const Tensor& weight, const Tensor& weight_sums,
                      const Tensor& scales, const OptTensor& zero_points, int64_t bits, const OptTensor& bias,
                      Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::linear_dq.out";
  Status st;
  Layout lsum, lsc;
  // weight_sums: int32 with the scales' elements ([N, groups]; [N] per channel), as laid out
  bool ok = contiguous_of(op, "weight_sums", weight_sums, ScalarType::Int, lsum, st) &&
      layout_of(scales, "scales", lsc, st);
  if (ok && lsum.numel() != lsc.numel()) {
    ok = st.fail("%s: weight_sums %s must have the scales' shape %s", op, etfuse::core::ShapeStr(lsum).c_str(),
                 etfuse::core::ShapeStr(lsc).c_str());
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  const int32_t* wsum = weight_sums.const_data_ptr<int32_t>();
  return quantized_weight_linear_out(op, ctx, input, weight, scales, zero_points, bits, bias, activation, residual,
                                     out, [wsum](const qw::Args& args) {
                                       qw::Args a = args;
                                       a.wsum = wsum;
                                       dq::Scratch scratch;
                                       dq::run(a, scratch, Parallel{});
                                     });
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_dq.out", linear_dq_out);
