// etfuse::conv2d_bn_packed_act.out: conv2d_bn_act (groups 1) on a weight packed once, at fuse time
// (etfuse.passes.PrepackWeightsPass); the batch norm stays the per-channel epilogue of
// batch_norm_epilogue.h, so the weights are packed as they are, not rewritten.
#include "ops/batch_norm_epilogue.h"
#include "ops/conv2d.h"

namespace {

using namespace etfuse::adapter;

Tensor& conv2d_bn_packed_act_out(Context& ctx, const Tensor& input, const Tensor& packed_weight, IntList weight_size,
                                 const OptTensor& bias, const OptTensor& bn_weight, const OptTensor& bn_bias,
                                 const Tensor& running_mean, const Tensor& running_var, double eps, IntList stride,
                                 IntList padding, IntList dilation, std::optional<double> min,
                                 std::optional<double> max, Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_bn_packed_act.out";
  Status st;
  BatchNormEpilogue e;
  const int64_t channels = weight_size.size() > 0 ? static_cast<int64_t>(weight_size[0]) : 0;
  const bool ok = batch_norm_epilogue(op, channels, bias, bn_weight, bn_bias, running_mean, running_var, eps, e, st);
  return conv2d_into(ctx, op, input, packed_weight, e.shift, &e.shift_layout, nullptr, e.scale, stride,
                     padding, dilation, 1, min, max, activation, residual, ok, st, out, &weight_size);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "conv2d_bn_packed_act.out", conv2d_bn_packed_act_out);
