// ExecuTorch runtime registration of the etfuse kernel cores: `etfuse::<op>.out` kernels.
//
// `out` is resized with resize_tensor (with dynamic shapes it is allocated at an upper bound).
// Bad input fails the kernel through ET_KERNEL_CHECK_MSG, so Method::execute returns an error
// to the caller instead of aborting the process. Loops run on the ExecuTorch threadpool.
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "core/add_relu.h"
#include "core/addmm_relu.h"
#include "core/linear_relu.h"
#include "core/probe.h"
#include "runtime_common.h"

namespace core = etfuse::core;

namespace {

using core::Layout;
using core::Status;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

using namespace etfuse::runtime;  // shared helpers (runtime_common.h)

Tensor& add_relu_out(KernelRuntimeContext& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  constexpr const char* op = "etfuse::add_relu.out";
  Status st;
  Layout la, lb, lo;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  const bool ok = check_float(op, "self", self, st) && check_float(op, "other", other, st) &&
      check_float(op, "out", out, st) && layout_of(self, "self", la, st) && layout_of(other, "other", lb, st) &&
      core::add_relu::out_shape(la, lb, ndim, sizes, st) && resize_out(op, out, ndim, sizes, lo, st) &&
      core::add_relu::check_out(la, lb, lo, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  core::add_relu::run(
      self.const_data_ptr<float>(), la, other.const_data_ptr<float>(), lb, out.mutable_data_ptr<float>(), lo,
      EtParallel{});
  return out;
}

Tensor& linear_relu_out(
    KernelRuntimeContext& ctx, const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
    Tensor& out) {
  constexpr const char* op = "etfuse::linear_relu.out";
  Status st;
  Layout li, lw, lb, lo;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  core::gemm::Args g;
  const bool has_bias = bias.has_value();
  const bool ok = check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      (!has_bias || check_float(op, "bias", *bias, st)) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) && layout_of(weight, "weight", lw, st) &&
      (!has_bias || layout_of(*bias, "bias", lb, st)) &&
      core::linear_relu::out_shape(li, lw, has_bias ? &lb : nullptr, ndim, sizes, st) &&
      resize_out(op, out, ndim, sizes, lo, st) &&
      core::linear_relu::make_args(
          input.const_data_ptr<float>(), li, weight.const_data_ptr<float>(), lw,
          has_bias ? bias->const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr,
          out.mutable_data_ptr<float>(), lo, g, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  core::linear_relu::run(g, EtParallel{});
  return out;
}

Tensor& addmm_relu_out(
    KernelRuntimeContext& ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2, Tensor& out) {
  constexpr const char* op = "etfuse::addmm_relu.out";
  Status st;
  Layout ls, l1, l2, lo;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  core::gemm::Args g;
  const bool ok = check_float(op, "self", self, st) && check_float(op, "mat1", mat1, st) &&
      check_float(op, "mat2", mat2, st) && check_float(op, "out", out, st) && layout_of(self, "self", ls, st) &&
      layout_of(mat1, "mat1", l1, st) && layout_of(mat2, "mat2", l2, st) &&
      core::addmm_relu::out_shape(ls, l1, l2, ndim, sizes, st) && resize_out(op, out, ndim, sizes, lo, st) &&
      core::addmm_relu::make_args(
          self.const_data_ptr<float>(), ls, mat1.const_data_ptr<float>(), l1, mat2.const_data_ptr<float>(), l2,
          out.mutable_data_ptr<float>(), lo, g, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  core::addmm_relu::run(g, EtParallel{});
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(etfuse, "add_relu.out", add_relu_out);
EXECUTORCH_LIBRARY(etfuse, "linear_relu.out", linear_relu_out);
EXECUTORCH_LIBRARY(etfuse, "addmm_relu.out", addmm_relu_out);

// Plain C entry points for etfuse.kernels (ctypes): diagnostics and the benchmark's
// memory-bandwidth probe, run on the same threadpool with the same split as add_relu.
ETFUSE_EXPORT const char* etfuse_runtime_isa() {
  return core::current_isa_name();
}

ETFUSE_EXPORT int etfuse_runtime_set_isa(const char* name) {
  return core::set_isa(name) ? 1 : 0;
}

ETFUSE_EXPORT int64_t etfuse_runtime_thread_count() {
  return executorch::extension::get_thread_count();
}

// Median seconds of `reps` runs of c = a + b over n floats.
ETFUSE_EXPORT double etfuse_probe_stream_add(const float* a, const float* b, float* c, int64_t n, int64_t reps) {
  if (reps < 1) reps = 1;
  std::vector<double> times(static_cast<size_t>(reps));
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    core::probe::stream_add(a, b, c, n, EtParallel{});
    const auto t1 = std::chrono::steady_clock::now();
    times[static_cast<size_t>(r)] = std::chrono::duration<double>(t1 - t0).count();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
