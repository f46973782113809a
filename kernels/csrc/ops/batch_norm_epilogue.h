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
  std::vector<float> values;  // scale, shift and the statistics read for them: one allocation per call
  const float* scale = nullptr;
  const float* shift = nullptr;
  Layout shift_layout;  // [channels], contiguous: what the cores take as their bias
};

inline bool batch_norm_epilogue(const char* op, int64_t channels, const OptTensor& bias, const OptTensor& bn_weight,
                                const OptTensor& bn_bias, const Tensor& mean, const Tensor& var, double eps,
                                BatchNormEpilogue& e, Status& st) {
  // the statistics read into one buffer after scale and shift: [scale | shift | b | gamma | beta | mean | var]
  const size_t C = static_cast<size_t>(channels);
  e.values.resize(7 * C);
  float *scale = e.values.data(), *shift = scale + C, *b = shift + C, *gamma = b + C, *beta = gamma + C;
  float *m = beta + C, *v = m + C;
  const bool ok = (!has(bias) || (check_float(op, "bias", *bias, st) && row_values(op, "bias", *bias, channels, b, st))) &&
      (!has(bn_weight) ||
       (check_float(op, "bn_weight", *bn_weight, st) && row_values(op, "bn_weight", *bn_weight, channels, gamma, st))) &&
      (!has(bn_bias) ||
       (check_float(op, "bn_bias", *bn_bias, st) && row_values(op, "bn_bias", *bn_bias, channels, beta, st))) &&
      check_float(op, "running_mean", mean, st) && row_values(op, "running_mean", mean, channels, m, st) &&
      check_float(op, "running_var", var, st) && row_values(op, "running_var", var, channels, v, st);
  if (!ok) return false;
  const bool with_b = has(bias), with_gamma = has(bn_weight), with_beta = has(bn_bias);
  for (int64_t c = 0; c < channels; ++c) {
    // float32 like ATen's batch norm: invstd = 1 / sqrt(var + eps)
    const float invstd = 1.0f / std::sqrt(v[c] + static_cast<float>(eps));
    const float s = (with_gamma ? gamma[c] : 1.0f) * invstd;
    scale[c] = s;
    shift[c] = ((with_b ? b[c] : 0.0f) - m[c]) * s + (with_beta ? beta[c] : 0.0f);
  }
  e.scale = scale;
  e.shift = shift;
  const int64_t one = 1;
  return core::make_layout(e.shift_layout, 1, &channels, &one, "shift", st);
}

}  // namespace adapter
}  // namespace etfuse
