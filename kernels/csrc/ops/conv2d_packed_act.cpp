// etfuse::conv2d_packed_act.out: conv2d_act (groups 1) on a weight packed once, at fuse time, into the
// GEMM's column panels (etfuse.passes.PrepackWeightsPass): the transposed problem on the GEMM's
// tiles, no per-call packing (core/conv2d.h, run_packed).
#include "ops/conv2d.h"

namespace {

using namespace etfuse::adapter;

Tensor& conv2d_packed_act_out(Context& ctx, const Tensor& input, const Tensor& packed_weight, IntList weight_size,
                              const OptTensor& bias, IntList stride, IntList padding, IntList dilation,
                              std::optional<double> min, std::optional<double> max, Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_packed_act.out";
  Status st;
  Layout lb;
  const bool has_bias = has(bias);
  const bool ok = !has_bias || (check_float(op, "bias", *bias, st) && layout_of(*bias, "bias", lb, st));
  return conv2d_into(ctx, op, input, packed_weight, ok && has_bias ? bias->const_data_ptr<float>() : nullptr,
                     has_bias ? &lb : nullptr, has_bias ? &*bias : nullptr, nullptr, stride, padding, dilation, 1, min,
                     max, activation, residual, ok, st, out, &weight_size);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "conv2d_packed_act.out", conv2d_packed_act_out);
