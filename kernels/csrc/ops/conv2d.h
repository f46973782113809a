// The conv2d ops' shared body (conv2d_act.cpp, conv2d_bn_act.cpp): one call of the conv2d core
// (core/conv2d.h) with a clamp, a per-channel bias, an optional per-channel scale and an
// activation after it (core/activation.h). Included
// by op files only.
#pragma once

#include "adapter.h"
#include "core/conv2d.h"
#include "ops/clamp_args.h"

namespace etfuse {
namespace adapter {

// `bias`/`lb`: the per-channel values added last (null: none); `bias_tensor`: the tensor they
// live in, when they are an input (null when computed by the op); `scale`: null or [Cout] floats.
inline Tensor& conv2d_into(Context& ctx, const char* op, const Tensor& input, const Tensor& weight, const float* bias,
                           const Layout* lb, const Tensor* bias_tensor, const float* scale, IntList stride,
                           IntList padding, IntList dilation, int64_t groups, std::optional<double> min,
                           std::optional<double> max, const Str& activation, bool ok, Status& st, Tensor& out) {
  namespace conv = core::conv2d;
  Layout li, lw;
  conv::Params p;
  p.groups = groups;
  core::gemm_entry::Clamp c;
  core::activation::Kind act = core::activation::Kind::kNone;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  ok = ok && check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      check_float(op, "out", out, st) && layout_of(input, "input", li, st) && layout_of(weight, "weight", lw, st) &&
      conv::pair("stride", stride.data(), stride.size(), p.stride, st) &&
      conv::pair("padding", padding.data(), padding.size(), p.padding, st) &&
      conv::pair("dilation", dilation.data(), dilation.size(), p.dilation, st) && clamp_of(op, min, max, c, st) &&
      activation_of(op, activation, act, st) && conv::out_shape(li, lw, lb, p, ndim, sizes, st) && o.resize(op, ndim, sizes, st);
  p.has_min = min.has_value();
  p.has_max = max.has_value();
  p.min = c.lo;
  p.max = c.hi;
  // Weights from a .pte are contiguous; anything else is copied once per call.
  Input w(weight, lw);
  if (ok && !conv::weight_is_matrix(lw)) w.make_contiguous();
  conv::Problem pb;
  ok = ok && conv::make_problem(input.const_data_ptr<float>(), li, w.data<float>(), w.layout(), bias, lb,
                                o.data<float>(), o.layout(), p, pb, st) &&
      o.open({&input, &weight, bias_tensor}, false, conv::out_is_flat(pb), st) &&
      conv::make_problem(input.const_data_ptr<float>(), li, w.data<float>(), w.layout(), bias, lb, o.data<float>(),
                         o.write_layout(), p, pb, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  pb.scale = scale;
  pb.scale_s = scale ? 1 : 0;
  conv::run(pb, Parallel{});
  core::activation::apply(act, o.data<float>(), o.write_layout(), Parallel{});
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
