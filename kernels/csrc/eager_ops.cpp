// torch eager registration of the etfuse kernel cores: CPU kernels for the `.out` variants.
//
// The schemas (and fake kernels) are defined in Python by etfuse.backend_ops, which must be
// imported before this library is loaded. Like ATen out ops, `out` is resized with
// resize_output, must be float32, and must not partially overlap an input.
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "core/add_relu.h"
#include "core/addmm_relu.h"
#include "core/linear_relu.h"
#include "eager_common.h"

namespace core = etfuse::core;

namespace {

using core::Layout;
using core::Status;

using namespace etfuse::eager;  // shared helpers (eager_common.h)

at::Tensor& add_relu_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  constexpr const char* op = "etfuse::add_relu.out";
  check_float(op, "self", self);
  check_float(op, "other", other);
  check_float(op, "out", out);
  const Layout la = layout_of(self, "self"), lb = layout_of(other, "other");
  Status st;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  TORCH_CHECK(core::add_relu::out_shape(la, lb, ndim, sizes, st), st.msg);
  at::native::resize_output(out, at::IntArrayRef(sizes, ndim));
  at::assert_no_internal_overlap(out);
  at::assert_no_partial_overlap(out, self);
  at::assert_no_partial_overlap(out, other);
  const Layout lo = layout_of(out, "out");
  TORCH_CHECK(core::add_relu::check_out(la, lb, lo, st), st.msg);
  core::add_relu::run(
      self.const_data_ptr<float>(), la, other.const_data_ptr<float>(), lb, out.mutable_data_ptr<float>(), lo,
      AtenParallel{});
  return out;
}

// Shared tail of the two GEMM ops: runs into `out`, or into a fresh tensor copied into `out`
// when out aliases an input or cannot be viewed as a matrix.
template <class MakeArgs>
at::Tensor& gemm_into(at::Tensor& out, std::initializer_list<const at::Tensor*> inputs, const MakeArgs& make_args) {
  bool direct = true;
  for (const at::Tensor* t : inputs) direct = direct && !(t && overlaps(out, *t));
  at::Tensor dst = out;
  Status st;
  core::gemm::Args g;
  if (direct) {
    at::assert_no_internal_overlap(out);
    direct = make_args(dst, g, st);
  }
  if (!direct) {
    dst = at::empty(out.sizes(), out.options());
    TORCH_CHECK(make_args(dst, g, st), st.msg);
  }
  core::gemm::run(g, AtenParallel{});
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

at::Tensor& linear_relu_out(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias_opt, at::Tensor& out) {
  constexpr const char* op = "etfuse::linear_relu.out";
  const bool has_bias = bias_opt.has_value() && bias_opt->defined();
  check_float(op, "input", input);
  check_float(op, "weight", weight);
  if (has_bias) check_float(op, "bias", *bias_opt);
  check_float(op, "out", out);
  Layout li = layout_of(input, "input");
  const Layout lw = layout_of(weight, "weight");
  const Layout lb = has_bias ? layout_of(*bias_opt, "bias") : Layout{};
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
  const at::Tensor bias = has_bias ? *bias_opt : at::Tensor();
  return gemm_into(out, {&input, &weight, has_bias ? &bias : nullptr}, [&](at::Tensor& dst, core::gemm::Args& g, Status& s) {
    return core::linear_relu::make_args(
        in.const_data_ptr<float>(), li, weight.const_data_ptr<float>(), lw,
        has_bias ? bias.const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr, dst.mutable_data_ptr<float>(),
        layout_of(dst, "out"), g, s);
  });
}

at::Tensor& addmm_relu_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, at::Tensor& out) {
  constexpr const char* op = "etfuse::addmm_relu.out";
  check_float(op, "self", self);
  check_float(op, "mat1", mat1);
  check_float(op, "mat2", mat2);
  check_float(op, "out", out);
  const Layout ls = layout_of(self, "self"), l1 = layout_of(mat1, "mat1"), l2 = layout_of(mat2, "mat2");
  Status st;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  TORCH_CHECK(core::addmm_relu::out_shape(ls, l1, l2, ndim, sizes, st), st.msg);
  at::native::resize_output(out, at::IntArrayRef(sizes, ndim));
  return gemm_into(out, {&self, &mat1, &mat2}, [&](at::Tensor& dst, core::gemm::Args& g, Status& s) {
    return core::addmm_relu::make_args(
        self.const_data_ptr<float>(), ls, mat1.const_data_ptr<float>(), l1, mat2.const_data_ptr<float>(), l2,
        dst.mutable_data_ptr<float>(), layout_of(dst, "out"), g, s);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(etfuse, CPU, m) {
  m.impl("add_relu.out", TORCH_FN(add_relu_out));
  m.impl("linear_relu.out", TORCH_FN(linear_relu_out));
  m.impl("addmm_relu.out", TORCH_FN(addmm_relu_out));
}

// Plain C entry points (ctypes), mirroring the runtime library's.
ETFUSE_EXPORT const char* etfuse_eager_isa() {
  return core::current_isa_name();
}

ETFUSE_EXPORT int etfuse_eager_set_isa(const char* name) {
  return core::set_isa(name) ? 1 : 0;
}
