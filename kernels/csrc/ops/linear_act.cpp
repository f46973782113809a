// etfuse::linear_act.out: activation(clamp(input @ weight.T + bias [+ residual], min, max)): the GEMM entry
// with the op's clamp and residual.
#include "ops/clamp_args.h"
#include "ops/linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& linear_act_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias,
                       std::optional<double> min, std::optional<double> max, Str activation,
                       const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::linear_act.out";
  Status st;
  etfuse::core::gemm_entry::Clamp c;
  etfuse::core::activation::Kind act;
  bool gated;
  const bool ok = clamp_of(op, min, max, c, st) && linear_activation_of(op, activation, act, gated, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  return linear_into(ctx, op, input, weight, bias, c, act, true, out, -1, has(residual) ? &*residual : nullptr,
                     gated);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_act.out", linear_act_out);
