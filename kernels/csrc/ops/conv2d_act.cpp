// etfuse::conv2d_act.out: activation(clamp(conv2d(input, weight, bias) [+ residual], min, max)), float32, NCHW
// (core/conv2d.h, core/activation.h).
#include "ops/conv2d.h"

namespace {

using namespace etfuse::adapter;

Tensor& conv2d_act_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias, IntList stride,
                       IntList padding, IntList dilation, int64_t groups, std::optional<double> min,
                       std::optional<double> max, Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_act.out";
  Status st;
  Layout lb;
  const bool has_bias = has(bias);
  const bool ok = !has_bias || (check_float(op, "bias", *bias, st) && layout_of(*bias, "bias", lb, st));
  return conv2d_into(ctx, op, input, weight, ok && has_bias ? bias->const_data_ptr<float>() : nullptr,
                     has_bias ? &lb : nullptr, has_bias ? &*bias : nullptr, nullptr, stride, padding, dilation,
                     groups, min, max, activation, residual, ok, st, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "conv2d_act.out", conv2d_act_out);
