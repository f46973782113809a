// The `float? min, float? max` arguments of the *_act ops as the GEMM epilogue's clamp, and
// their `str activation`.
#pragma once

#include "adapter.h"
#include "core/activation.h"
#include "core/gemm_entry.h"

namespace etfuse {
namespace adapter {

inline bool clamp_of(const char* op, const std::optional<double>& min, const std::optional<double>& max,
                     core::gemm_entry::Clamp& c, Status& st) {
  const float lo = min.has_value() ? static_cast<float>(*min) : 0.0f;
  const float hi = max.has_value() ? static_cast<float>(*max) : 0.0f;
  if (min.has_value() && max.has_value() && lo > hi) {
    return st.fail("%s: min %g is greater than max %g", op, (double)lo, (double)hi);
  }
  c = core::gemm_entry::Clamp::between(min.has_value(), lo, max.has_value(), hi);
  return true;
}

// The `str activation` argument of the *_act ops: what runs after the clamp.
inline bool activation_of(const char* op, const Str& name, core::activation::Kind& kind, Status& st) {
  return core::activation::parse(op, name.data(), name.size(), kind, st);
}

// The `str activation` of a linear op: one of the above, or a gated one (`gated` set, `kind` the
// activation of the first half: core/activation.h parse_gated).
inline bool linear_activation_of(const char* op, const Str& name, core::activation::Kind& kind, bool& gated,
                                 Status& st) {
  gated = core::activation::parse_gated(name.data(), name.size(), kind);
  Status plain;
  if (gated || activation_of(op, name, kind, plain)) return true;
  return st.fail("%s: unknown activation '%.*s' (none, silu, sigmoid, gelu, gelu_tanh, hardswish, hardsigmoid; "
                 "gated: swiglu, geglu, geglu_tanh)", op, (int)name.size(), name.data());
}

// A gated linear writes all its features into `sums` (laid out as `lsums`, contiguous) and
// combines their halves into out: `sizes` (out's shape with every feature, last) becomes out's,
// the features halved. Fails on an odd number of features.
inline bool gated_sums(const char* op, int ndim, int64_t* sizes, Layout& lsums, std::vector<float>& sums,
                       Status& st) {
  if (sizes[ndim - 1] % 2 != 0) {
    return st.fail("%s: a gated activation needs an even number of output features, got %lld", op,
                   (long long)sizes[ndim - 1]);
  }
  lsums.ndim = ndim;
  for (int d = 0; d < ndim; ++d) lsums.sizes[d] = sizes[d];
  lsums = contiguous_layout(lsums);
  sums.resize(static_cast<size_t>(lsums.numel()));
  sizes[ndim - 1] /= 2;
  return true;
}

}  // namespace adapter
}  // namespace etfuse
