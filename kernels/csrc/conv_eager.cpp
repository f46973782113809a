// torch eager registration of etfuse::conv2d_act.out and etfuse::linear_act.out (cores:
// core/conv2d.h, core/linear_relu.h on core/gemm.h). Linked into libetfuse_eager.so next to
// eager_ops.cpp; schemas and fake kernels come from etfuse.backend_ops.gemm_conv_ops.
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "core/conv2d.h"
#include "core/linear_relu.h"
#include "eager_common.h"

namespace core = etfuse::core;

namespace {

using core::Layout;
using core::Status;

using namespace etfuse::eager;  // shared helpers (eager_common.h)

void clamp_params(const char* op, std::optional<double> min, std::optional<double> max, bool& has_min, float& lo,
                  bool& has_max, float& hi) {
  has_min = min.has_value();
  has_max = max.has_value();
  lo = has_min ? static_cast<float>(*min) : -__builtin_inff();
  hi = has_max ? static_cast<float>(*max) : __builtin_inff();
  TORCH_CHECK(!(has_min && has_max && lo > hi), op, ": min ", lo, " is greater than max ", hi);
}

// A destination for the kernel: `out` itself, or a fresh contiguous tensor (copied back) when
// out aliases an input or its layout does not suit the kernel.
at::Tensor destination(at::Tensor& out, std::initializer_list<const at::Tensor*> inputs, bool layout_ok) {
  bool direct = layout_ok;
  for (const at::Tensor* t : inputs) direct = direct && !(t && overlaps(out, *t));
  if (direct) {
    at::assert_no_internal_overlap(out);
    return out;
  }
  return at::empty(out.sizes(), out.options());
}

at::Tensor& conv2d_act_out(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias_opt,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    std::optional<double> min, std::optional<double> max, at::Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_act.out";
  const bool has_bias = bias_opt.has_value() && bias_opt->defined();
  check_float(op, "input", input);
  check_float(op, "weight", weight);
  if (has_bias) check_float(op, "bias", *bias_opt);
  check_float(op, "out", out);
  core::conv2d::Params p;
  p.groups = groups;
  Status st;
  TORCH_CHECK(core::conv2d::pair("stride", stride.data(), stride.size(), p.stride, st), st.msg);
  TORCH_CHECK(core::conv2d::pair("padding", padding.data(), padding.size(), p.padding, st), st.msg);
  TORCH_CHECK(core::conv2d::pair("dilation", dilation.data(), dilation.size(), p.dilation, st), st.msg);
  float lo, hi;
  clamp_params(op, min, max, p.has_min, lo, p.has_max, hi);
  p.min = lo;
  p.max = hi;
  const at::Tensor w = weight.is_contiguous() ? weight : weight.contiguous();
  const at::Tensor bias = has_bias ? *bias_opt : at::Tensor();
  const Layout li = layout_of(input, "input"), lw = layout_of(w, "weight");
  const Layout lb = has_bias ? layout_of(bias, "bias") : Layout{};
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  TORCH_CHECK(core::conv2d::out_shape(li, lw, has_bias ? &lb : nullptr, p, ndim, sizes, st), st.msg);
  at::native::resize_output(out, at::IntArrayRef(sizes, ndim));
  core::conv2d::Problem pb;
  TORCH_CHECK(core::conv2d::make_problem(
      input.const_data_ptr<float>(), li, w.const_data_ptr<float>(), lw, has_bias ? bias.const_data_ptr<float>() : nullptr,
      has_bias ? &lb : nullptr, out.mutable_data_ptr<float>(), layout_of(out, "out"), p, pb, st), st.msg);
  at::Tensor dst = destination(out, {&input, &weight, has_bias ? &bias : nullptr}, core::conv2d::out_is_flat(pb));
  if (!dst.is_same(out)) {
    TORCH_CHECK(core::conv2d::make_problem(
        input.const_data_ptr<float>(), li, w.const_data_ptr<float>(), lw,
        has_bias ? bias.const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr, dst.mutable_data_ptr<float>(),
        layout_of(dst, "out"), p, pb, st), st.msg);
  }
  core::conv2d::run(pb, AtenParallel{});
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

at::Tensor& linear_act_out(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias_opt,
    std::optional<double> min, std::optional<double> max, at::Tensor& out) {
  constexpr const char* op = "etfuse::linear_act.out";
  const bool has_bias = bias_opt.has_value() && bias_opt->defined();
  check_float(op, "input", input);
  check_float(op, "weight", weight);
  if (has_bias) check_float(op, "bias", *bias_opt);
  check_float(op, "out", out);
  bool has_min, has_max;
  float lo, hi;
  clamp_params(op, min, max, has_min, lo, has_max, hi);
  Layout li = layout_of(input, "input");
  const Layout lw = layout_of(weight, "weight");
  const at::Tensor bias = has_bias ? *bias_opt : at::Tensor();
  const Layout lb = has_bias ? layout_of(bias, "bias") : Layout{};
  Status st;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  TORCH_CHECK(core::linear_relu::out_shape(li, lw, has_bias ? &lb : nullptr, ndim, sizes, st), st.msg);
  at::native::resize_output(out, at::IntArrayRef(sizes, ndim));
  at::Tensor in = input;
  int64_t m, rs, cs;
  if (!core::linear_relu::as_matrix(li, m, rs, cs)) {
    in = input.contiguous();
    li = layout_of(in, "input");
  }
  const Layout lo_out = layout_of(out, "out");
  at::Tensor dst = destination(out, {&input, &weight, has_bias ? &bias : nullptr},
                               core::linear_relu::as_matrix(lo_out, m, rs, cs));
  core::gemm::Args g;
  TORCH_CHECK(core::linear_relu::make_args(
      in.const_data_ptr<float>(), li, weight.const_data_ptr<float>(), lw, has_bias ? bias.const_data_ptr<float>() : nullptr,
      has_bias ? &lb : nullptr, dst.mutable_data_ptr<float>(), layout_of(dst, "out"), g, st), st.msg);
  g.relu = has_min || has_max;
  g.act_min = lo;
  g.act_max = hi;
  core::gemm::run(g, AtenParallel{});
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(etfuse, CPU, m) {
  m.impl("conv2d_act.out", TORCH_FN(conv2d_act_out));
  m.impl("linear_act.out", TORCH_FN(linear_act_out));
}
