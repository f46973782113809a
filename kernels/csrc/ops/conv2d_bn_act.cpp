// etfuse::conv2d_bn_act.out: clamp(batch_norm_eval(conv2d(input, weight, bias)) [+ residual], min, max), float32,
// NCHW: the conv2d core with the batch norm as its per-channel scale and shift (batch_norm_epilogue.h).
#include "ops/batch_norm_epilogue.h"
#include "ops/conv2d.h"

namespace {

using namespace etfuse::adapter;

Tensor& conv2d_bn_act_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias,
                          const OptTensor& bn_weight, const OptTensor& bn_bias, const Tensor& running_mean,
                          const Tensor& running_var, double eps, IntList stride, IntList padding, IntList dilation,
                          int64_t groups, std::optional<double> min, std::optional<double> max, Str activation,
                          const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_bn_act.out";
  Status st;
  BatchNormEpilogue e;
  const int64_t channels = weight.dim() > 0 ? weight.size(0) : 0;
  const bool ok = batch_norm_epilogue(op, channels, bias, bn_weight, bn_bias, running_mean, running_var, eps, e, st);
  return conv2d_into(ctx, op, input, weight, e.shift, &e.shift_layout, nullptr, e.scale, stride,
                     padding, dilation, groups, min, max, activation, residual, ok, st, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "conv2d_bn_act.out", conv2d_bn_act_out);
