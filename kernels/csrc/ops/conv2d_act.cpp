// etfuse::conv2d_act.out: clamp(conv2d(input, weight, bias), min, max), float32, NCHW (core/conv2d.h).
#include "adapter.h"
#include "core/conv2d.h"
#include "ops/clamp_args.h"

namespace {

using namespace etfuse::adapter;
namespace core = etfuse::core;
namespace conv = etfuse::core::conv2d;

Tensor& conv2d_act_out(Context& ctx, const Tensor& input, const Tensor& weight, const OptTensor& bias, IntList stride,
                       IntList padding, IntList dilation, int64_t groups, std::optional<double> min,
                       std::optional<double> max, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_act.out";
  Status st;
  Layout li, lw, lb;
  conv::Params p;
  p.groups = groups;
  core::gemm_entry::Clamp c;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  const bool has_bias = has(bias);
  Out o(out);
  bool ok = check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      (!has_bias || check_float(op, "bias", *bias, st)) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) && layout_of(weight, "weight", lw, st) &&
      (!has_bias || layout_of(*bias, "bias", lb, st)) &&
      conv::pair("stride", stride.data(), stride.size(), p.stride, st) &&
      conv::pair("padding", padding.data(), padding.size(), p.padding, st) &&
      conv::pair("dilation", dilation.data(), dilation.size(), p.dilation, st) && clamp_of(op, min, max, c, st) &&
      conv::out_shape(li, lw, has_bias ? &lb : nullptr, p, ndim, sizes, st) && o.resize(op, ndim, sizes, st);
  p.has_min = min.has_value();
  p.has_max = max.has_value();
  p.min = c.lo;
  p.max = c.hi;
  // Weights from a .pte are contiguous; anything else is copied once per call.
  Input w(weight, lw);
  if (ok && !conv::weight_is_matrix(lw)) w.make_contiguous();
  conv::Problem pb;
  ok = ok && conv::make_problem(input.const_data_ptr<float>(), li, w.data<float>(), w.layout(),
                                has_bias ? bias->const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr,
                                o.data<float>(), o.layout(), p, pb, st) &&
      o.open({&input, &weight, has_bias ? &*bias : nullptr}, false, conv::out_is_flat(pb), st) &&
      conv::make_problem(input.const_data_ptr<float>(), li, w.data<float>(), w.layout(),
                         has_bias ? bias->const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr,
                         o.data<float>(), o.write_layout(), p, pb, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  conv::run(pb, Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "conv2d_act.out", conv2d_act_out);
