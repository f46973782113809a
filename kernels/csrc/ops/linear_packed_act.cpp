// etfuse::linear_packed_act.out: linear_act on a weight packed once, at fuse time, into the GEMM's
// column panels (etfuse.passes.PrepackWeightsPass): no per-call packing of the weight.
#include "ops/clamp_args.h"
#include "ops/linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& linear_packed_act_out(Context& ctx, const Tensor& input, const Tensor& packed_weight, int64_t out_features,
                              const OptTensor& bias, std::optional<double> min, std::optional<double> max,
                              Str activation, const OptTensor& residual, Tensor& out) {
  constexpr const char* op = "etfuse::linear_packed_act.out";
  Status st;
  etfuse::core::gemm_entry::Clamp c;
  etfuse::core::activation::Kind act;
  bool gated;
  const bool ok = clamp_of(op, min, max, c, st) && linear_activation_of(op, activation, act, gated, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  return linear_into(ctx, op, input, packed_weight, bias, c, act, true, out, out_features,
                     has(residual) ? &*residual : nullptr, gated);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "linear_packed_act.out", linear_packed_act_out);
