// etfuse::rms_norm.out: x * rsqrt(mean(x^2, -1) + eps) * weight over the last dimension (core/norm.h).
#include "ops/norm.h"

namespace {

using namespace etfuse::adapter;

Tensor& rms_norm_out(Context& ctx, const Tensor& input, const OptTensor& weight, double eps, Tensor& out) {
  return norm_into(ctx, "etfuse::rms_norm.out", false, input, weight, std::nullopt, eps, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "rms_norm.out", rms_norm_out);
