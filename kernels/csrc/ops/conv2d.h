// The conv2d ops' shared body (conv2d_act.cpp, conv2d_bn_act.cpp): one call of the conv2d core
// (core/conv2d.h) with a clamp, a per-channel bias, an optional per-channel scale, an optional
// residual and an activation after it (core/activation.h). Included
// by op files only.
#pragma once

#include "adapter.h"
#include "core/conv2d.h"
#include "ops/clamp_args.h"

namespace etfuse {
namespace adapter {

// conv2d_packed_act's weight: packed_weight is pack_gemm_weight(weight.reshape(Cout, K)) for a
// weight of `weight_size` [Cout, C, KH, KW] (groups 1). Fills `lw`, that weight's contiguous layout.
inline bool packed_conv_weight(const char* op, IntList weight_size, const Layout& lpacked, int64_t groups, Layout& lw,
                               Status& st) {
  if (weight_size.size() != 4) {
    return st.fail("%s: weight_size must have 4 values [Cout, C, KH, KW], got %lld", op, (long long)weight_size.size());
  }
  if (groups != 1) return st.fail("%s: groups must be 1 for a packed weight, got %lld", op, (long long)groups);
  int64_t sizes[4];
  for (int d = 0; d < 4; ++d) sizes[d] = static_cast<int64_t>(weight_size[d]);
  if (!core::make_layout(lw, 4, sizes, static_cast<const int64_t*>(nullptr), "weight", st)) return false;
  for (int d = 3, s = 1; d >= 0; --d) {
    lw.strides[d] = s;
    s *= sizes[d];
  }
  Layout lmat;
  if (!core::gemm_entry::packed_weight(lpacked, sizes[0], lmat, st, op)) return false;
  if (lmat.sizes[1] != sizes[1] * sizes[2] * sizes[3]) {
    return st.fail("%s: packed_weight %s does not hold a weight of shape %s (in_features must be C * KH * KW)", op,
                   core::ShapeStr(lpacked).c_str(), core::ShapeStr(lw).c_str());
  }
  return true;
}

// `bias`/`lb`: the per-channel values added last (null: none); `bias_tensor`: the tensor they
// live in, when they are an input (null when computed by the op); `scale`: null or [Cout] floats;
// `weight_size`: non-null when `weight` is packed (conv2d_packed_act, packed_conv_weight).
// `residual` (null: none), of out's shape, is added before the clamp (a residual block's skip
// connection); the core reads it at out's offsets (Problem::residual), so where its strides
// differ from those the core writes, it is copied once, contiguous, and so is out.
inline Tensor& conv2d_into(Context& ctx, const char* op, const Tensor& input, const Tensor& weight, const float* bias,
                           const Layout* lb, const Tensor* bias_tensor, const float* scale, IntList stride,
                           IntList padding, IntList dilation, int64_t groups, std::optional<double> min,
                           std::optional<double> max, const Str& activation, const OptTensor& residual_arg, bool ok,
                           Status& st, Tensor& out, const IntList* weight_size = nullptr) {
  namespace conv = core::conv2d;
  const bool packed = weight_size != nullptr;
  Layout li, lw, lpacked;
  conv::Params p;
  p.groups = groups;
  core::gemm_entry::Clamp c;
  core::activation::Kind act = core::activation::Kind::kNone;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  ok = ok && check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      check_float(op, "out", out, st) && layout_of(input, "input", li, st) &&
      (packed ? layout_of(weight, "packed_weight", lpacked, st) &&
                    packed_conv_weight(op, *weight_size, lpacked, groups, lw, st)
              : layout_of(weight, "weight", lw, st)) &&
      conv::pair("stride", stride.data(), stride.size(), p.stride, st) &&
      conv::pair("padding", padding.data(), padding.size(), p.padding, st) &&
      conv::pair("dilation", dilation.data(), dilation.size(), p.dilation, st) && clamp_of(op, min, max, c, st) &&
      activation_of(op, activation, act, st) && conv::out_shape(li, lw, lb, p, ndim, sizes, st) && o.resize(op, ndim, sizes, st);
  p.has_min = min.has_value();
  p.has_max = max.has_value();
  p.min = c.lo;
  p.max = c.hi;
  // Weights from a .pte are contiguous; anything else is copied once per call.
  Input w(weight, packed ? lpacked : lw);
  if (ok && !packed && !conv::weight_is_matrix(lw)) {
    w.make_contiguous();
    lw = w.layout();  // the copy's strides, not the argument's
  }
  const float* wdata = packed ? nullptr : w.data<float>();
  const Tensor* residual = has(residual_arg) ? &*residual_arg : nullptr;
  Layout lr;
  ok = ok && (!residual || (check_float(op, "residual", *residual, st) && layout_of(*residual, "residual", lr, st) &&
                            same_shape(op, "residual", lr, o.layout(), st)));
  // out is written where the residual's strides are, or contiguous (the residual copied so)
  const bool out_fits_residual = !residual || core::same_strides(lr, o.layout()) || core::is_contiguous(o.layout());
  conv::Problem pb;
  pb.packed = packed ? weight.const_data_ptr<float>() : nullptr;
  ok = ok && conv::make_problem(input.const_data_ptr<float>(), li, wdata, lw, bias, lb, o.data<float>(), o.layout(),
                                p, pb, st) &&
      o.open({&input, &weight, bias_tensor, residual}, false, conv::out_is_flat(pb) && out_fits_residual, st) &&
      conv::make_problem(input.const_data_ptr<float>(), li, wdata, lw, bias, lb, o.data<float>(), o.write_layout(),
                         p, pb, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  Input res(residual ? *residual : input, lr);
  if (residual && !core::same_strides(lr, o.write_layout())) res.make_contiguous();
  pb.residual = residual ? res.data<float>() : nullptr;
  pb.scale = scale;
  pb.scale_s = scale ? 1 : 0;
  conv::run(pb, Parallel{});
  core::activation::apply(act, o.data<float>(), o.write_layout(), Parallel{});
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
