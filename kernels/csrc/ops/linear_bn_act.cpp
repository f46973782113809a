// etfuse::linear_bn_act.out: clamp(batch_norm_eval(input @ weight.T + bias), min, max): the GEMM entry
// with the batch norm as its per-feature scale and shift (batch_norm_epilogue.h).
#include "ops/batch_norm_epilogue.h"
#include "ops/clamp_args.h"
#include "ops/linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& linear_bn_act_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias,
                          const OptTensor& bn_weight, const OptTensor& bn_bias, const Tensor& running_mean,
                          const Tensor& running_var, double eps, std::optional<double> min, std::optional<double> max,
                          Str activation, Tensor& out) {
  constexpr const char* op = "etfuse::linear_bn_act.out";
  Status st;
  BatchNormEpilogue e;
  etfuse::core::gemm_entry::Clamp c;
  etfuse::core::activation::Kind act = etfuse::core::activation::Kind::kNone;
  const int64_t features = weight.dim() > 0 ? weight.size(0) : 0;
  const bool ok = clamp_of(op, min, max, c, st) && activation_of(op, activation, act, st) &&
      batch_norm_epilogue(op, features, bias, bn_weight, bn_bias, running_mean, running_var, eps, e, st);
  return linear_into(ctx, op, input, weight, e.shift, &e.shift_layout, nullptr, e.scale, c, act, ok, st,
                     out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_bn_act.out", linear_bn_act_out);
