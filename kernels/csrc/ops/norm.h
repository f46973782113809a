// The norm ops' shared body (layer_norm.cpp, rms_norm.cpp): checks, contiguous copies where the
// strides need them, then one call of core/norm.h over the last dimension. Included by op files only.
#pragma once

#include "adapter.h"
#include "core/norm.h"

namespace etfuse {
namespace adapter {

// an optional per-feature vector of n floats: checked, and read contiguous
inline bool feature_vector(const char* op, const char* name, const OptTensor& t, int64_t n, Layout& l, Status& st) {
  if (!has(t)) return true;
  if (!check_float(op, name, *t, st) || !layout_of(*t, name, l, st)) return false;
  if (l.ndim != 1 || l.sizes[0] != n) {
    return st.fail("%s: %s %s must be [%lld], the input's last dimension", op, name, core::ShapeStr(l).c_str(),
                   (long long)n);
  }
  return true;
}

// layer norm (`layer`: centred, with an optional bias) or RMS norm (bias null) of `input`.
inline Tensor& norm_into(Context& ctx, const char* op, bool layer, const Tensor& input, const OptTensor& weight,
                         const OptTensor& bias, double eps, Tensor& out) {
  Status st;
  Layout li, lw, lb;
  Out o(out);
  bool ok = check_float(op, "input", input, st) && check_float(op, "out", out, st) && layout_of(input, "input", li, st);
  if (ok && li.ndim == 0) ok = st.fail("%s: input must have at least one dimension", op);
  const int64_t n = ok ? li.sizes[li.ndim - 1] : 0;
  ok = ok && feature_vector(op, "weight", weight, n, lw, st) && feature_vector(op, "bias", bias, n, lb, st);
  ok = ok && o.resize(op, li.ndim, li.sizes, st);
  Input in(input, li);
  if (ok && !is_contiguous(li)) in.make_contiguous();
  Input w(has(weight) ? *weight : input, lw), b(has(bias) ? *bias : input, lb);
  if (ok && has(weight) && lw.strides[0] != 1 && n > 1) w.make_contiguous();
  if (ok && has(bias) && lb.strides[0] != 1 && n > 1) b.make_contiguous();
  ok = ok && o.open({&input, has(weight) ? &*weight : nullptr, has(bias) ? &*bias : nullptr}, true,
                    is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  core::norm::Args a;
  a.n = n;
  a.rows = n ? li.numel() / n : 0;
  a.x = in.data<float>();
  a.weight = has(weight) ? w.data<float>() : nullptr;
  a.bias = has(bias) ? b.data<float>() : nullptr;
  a.eps = static_cast<float>(eps);
  a.out = o.data<float>();
  if (layer) {
    core::norm::run_layer(a, Parallel{});
  } else {
    core::norm::run(a, Parallel{});
  }
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
