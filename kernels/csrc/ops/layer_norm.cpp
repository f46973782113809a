// etfuse::layer_norm.out: (x - mean) * rsqrt(var + eps) * weight + bias over the last dimension (core/norm.h).
#include "ops/norm.h"

namespace {

using namespace etfuse::adapter;

Tensor& layer_norm_out(Context& ctx, const Tensor& input, const OptTensor& weight, const OptTensor& bias, double eps,
                       Tensor& out) {
  return norm_into(ctx, "etfuse::layer_norm.out", true, input, weight, bias, eps, out);
}

}  // namespace

ETFUSE_REGISTER(etfuse, "layer_norm.out", layer_norm_out);
