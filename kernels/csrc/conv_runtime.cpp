// ExecuTorch runtime registration of etfuse::conv2d_act.out and etfuse::linear_act.out
// (cores: core/conv2d.h, core/linear_relu.h on core/gemm.h). Linked into libetfuse_runtime.so
// next to runtime_ops.cpp. Bad input fails the kernel (ET_KERNEL_CHECK_MSG), never aborts.
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <optional>
#include <vector>

#include "core/conv2d.h"
#include "core/linear_relu.h"
#include "runtime_common.h"

namespace core = etfuse::core;

namespace {

using core::Layout;
using core::Status;
using executorch::aten::ArrayRef;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

using namespace etfuse::runtime;  // shared helpers (runtime_common.h)

bool clamp_params(const char* op, const std::optional<double>& min, const std::optional<double>& max, bool& has_min,
                  float& lo, bool& has_max, float& hi, Status& st) {
  has_min = min.has_value();
  has_max = max.has_value();
  lo = has_min ? static_cast<float>(*min) : 0.0f;
  hi = has_max ? static_cast<float>(*max) : 0.0f;
  if (has_min && has_max && lo > hi) return st.fail("%s: min %g is greater than max %g", op, (double)lo, (double)hi);
  return true;
}

Tensor& conv2d_act_out(
    KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
    ArrayRef<int64_t> stride, ArrayRef<int64_t> padding, ArrayRef<int64_t> dilation, int64_t groups,
    std::optional<double> min, std::optional<double> max, Tensor& out) {
  constexpr const char* op = "etfuse::conv2d_act.out";
  Status st;
  Layout li, lw, lb, lo;
  core::conv2d::Params p;
  p.groups = groups;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  const bool has_bias = bias.has_value();
  bool ok = check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      (!has_bias || check_float(op, "bias", *bias, st)) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) && layout_of(weight, "weight", lw, st) &&
      (!has_bias || layout_of(*bias, "bias", lb, st)) &&
      core::conv2d::pair("stride", stride.data(), stride.size(), p.stride, st) &&
      core::conv2d::pair("padding", padding.data(), padding.size(), p.padding, st) &&
      core::conv2d::pair("dilation", dilation.data(), dilation.size(), p.dilation, st) &&
      clamp_params(op, min, max, p.has_min, p.min, p.has_max, p.max, st) &&
      core::conv2d::out_shape(li, lw, has_bias ? &lb : nullptr, p, ndim, sizes, st) &&
      resize_out(op, out, ndim, sizes, lo, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  // Weights from a .pte are contiguous; anything else is copied once per call.
  const float* w = weight.const_data_ptr<float>();
  std::vector<float> wcopy;
  if (!core::conv2d::weight_is_matrix(lw)) {
    wcopy.resize(static_cast<size_t>(lw.numel()));
    size_t i = 0;
    for (int64_t a = 0; a < lw.sizes[0]; ++a)
      for (int64_t b = 0; b < lw.sizes[1]; ++b)
        for (int64_t c = 0; c < lw.sizes[2]; ++c)
          for (int64_t d = 0; d < lw.sizes[3]; ++d)
            wcopy[i++] = w[a * lw.strides[0] + b * lw.strides[1] + c * lw.strides[2] + d * lw.strides[3]];
    w = wcopy.data();
    Layout contiguous = lw;
    contiguous.strides[3] = 1;
    contiguous.strides[2] = lw.sizes[3];
    contiguous.strides[1] = lw.sizes[2] * lw.sizes[3];
    contiguous.strides[0] = lw.sizes[1] * lw.sizes[2] * lw.sizes[3];
    lw = contiguous;
  }
  core::conv2d::Problem pb;
  ok = core::conv2d::make_problem(
      input.const_data_ptr<float>(), li, w, lw, has_bias ? bias->const_data_ptr<float>() : nullptr,
      has_bias ? &lb : nullptr, out.mutable_data_ptr<float>(), lo, p, pb, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  ET_KERNEL_CHECK_MSG(
      ctx, core::conv2d::out_is_flat(pb), InvalidArgument, out,
      "%s: out of shape %s has rows that are not evenly strided", op, core::ShapeStr(lo).c_str());
  core::conv2d::run(pb, EtParallel{});
  return out;
}

Tensor& linear_act_out(
    KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
    std::optional<double> min, std::optional<double> max, Tensor& out) {
  constexpr const char* op = "etfuse::linear_act.out";
  Status st;
  Layout li, lw, lb, lo;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  core::gemm::Args g;
  bool has_min, has_max;
  float lo_v, hi_v;
  const bool has_bias = bias.has_value();
  const bool ok = check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      (!has_bias || check_float(op, "bias", *bias, st)) && check_float(op, "out", out, st) &&
      clamp_params(op, min, max, has_min, lo_v, has_max, hi_v, st) && layout_of(input, "input", li, st) &&
      layout_of(weight, "weight", lw, st) && (!has_bias || layout_of(*bias, "bias", lb, st)) &&
      core::linear_relu::out_shape(li, lw, has_bias ? &lb : nullptr, ndim, sizes, st) &&
      resize_out(op, out, ndim, sizes, lo, st) &&
      core::linear_relu::make_args(
          input.const_data_ptr<float>(), li, weight.const_data_ptr<float>(), lw,
          has_bias ? bias->const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr,
          out.mutable_data_ptr<float>(), lo, g, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  g.relu = has_min || has_max;
  g.act_min = has_min ? lo_v : -__builtin_inff();
  g.act_max = has_max ? hi_v : __builtin_inff();
  core::gemm::run(g, EtParallel{});
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(etfuse, "conv2d_act.out", conv2d_act_out);
EXECUTORCH_LIBRARY(etfuse, "linear_act.out", linear_act_out);
