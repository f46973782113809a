// The *_bn_act ops' epilogue: batch norm (eval) after a convolution / linear as one scale and
// shift per output channel, computed per call in O(channels) from the statistics the program
// holds, so the weights are never rewritten (the route `to_executorch(passes=...)` cannot fold
// them: its passes see no parameter values).
//
//   bn(acc + bias) = (acc + bias - mean) * gamma / sqrt(var + eps) + beta = acc * scale + shift
#pragma once

#include <cmath>
#include <vector>

#include "adapter.h"

namespace etfuse {
namespace adapter {

struct BatchNormEpilogue {
  std::vector<float> scale, shift;
  Layout shift_layout;  // [channels], contiguous: what the cores take as their bias
};

inline bool batch_norm_epilogue(const char* op, int64_t channels, const OptTensor& bias, const OptTensor& bn_weight,
                                const OptTensor& bn_bias, const Tensor& mean, const Tensor& var, double eps,
                                BatchNormEpilogue& e, Status& st) {
  std::vector<float> b, gamma, beta, m, v;
  const bool ok = (!has(bias) || (check_float(op, "bias", *bias, st) && row_values(op, "bias", *bias, channels, b, st))) &&
      (!has(bn_weight) ||
       (check_float(op, "bn_weight", *bn_weight, st) && row_values(op, "bn_weight", *bn_weight, channels, gamma, st))) &&
      (!has(bn_bias) ||
       (check_float(op, "bn_bias", *bn_bias, st) && row_values(op, "bn_bias", *bn_bias, channels, beta, st))) &&
      check_float(op, "running_mean", mean, st) && row_values(op, "running_mean", mean, channels, m, st) &&
      check_float(op, "running_var", var, st) && row_values(op, "running_var", var, channels, v, st);
  if (!ok) return false;
  e.scale.resize(static_cast<size_t>(channels));
  e.shift.resize(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    // float32 like ATen's batch norm: invstd = 1 / sqrt(var + eps)
    const float invstd = 1.0f / std::sqrt(v[c] + static_cast<float>(eps));
    const float s = (gamma.empty() ? 1.0f : gamma[c]) * invstd;
    e.scale[c] = s;
    e.shift[c] = ((b.empty() ? 0.0f : b[c]) - m[c]) * s + (beta.empty() ? 0.0f : beta[c]);
  }
  const int64_t one = 1;
  return core::make_layout(e.shift_layout, 1, &channels, &one, "shift", st);
}

}  // namespace adapter
}  // namespace etfuse
