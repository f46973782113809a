// torch eager registration of the quantized kernel cores (core/quantized.h): CPU kernels for
// quantized_decomposed::{add, add_relu}.out, add.scalar_out, embedding_byte.out and the
// per-tensor quantize/dequantize .out variants. Schemas live in Python (etfuse.backend_ops).
// Bad qparams or shapes raise a RuntimeError (TORCH_CHECK), never abort.
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "core/quantized.h"
#include "eager_common.h"

namespace core = etfuse::core;
namespace qc = etfuse::core::quantized;

namespace {

using core::Layout;
using core::Status;

using etfuse::eager::AtenParallel;
using etfuse::eager::layout_of;
using etfuse::eager::overlaps;

qc::QType qtype_of(const char* op, const char* name, at::ScalarType t) {
  if (t == at::kChar) return qc::QType::kInt8;
  if (t == at::kByte) return qc::QType::kUInt8;
  TORCH_CHECK(false, op, ": ", name, " must be int8 or uint8, got ", t);
}

void check_cpu(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
}

qc::QParams qparams(const char* op, const char* what, double scale, int64_t zp, int64_t qmin, int64_t qmax, qc::QType t) {
  qc::QParams q;
  Status st;
  TORCH_CHECK(qc::make_qparams(op, what, scale, zp, qmin, qmax, t, q, st), st.msg);
  return q;
}

template <class F>
at::Tensor& into(at::Tensor& out, std::initializer_list<const at::Tensor*> inputs, const F& fn) {
  bool direct = at::has_internal_overlap(out) == at::MemOverlap::No;
  for (const at::Tensor* t : inputs) direct = direct && !(t && overlaps(out, *t));
  at::Tensor dst = direct ? out : at::empty(out.sizes(), out.options());
  fn(dst);
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

template <class TA, class TB, class TO>
void dispatch_add(const at::Tensor& a, const at::Tensor& b, at::Tensor& o, const qc::QParams& qa, const qc::QParams& qb,
                  const qc::QParams& qo, bool relu) {
  qc::add(a.const_data_ptr<TA>(), layout_of(a, "a"), b.const_data_ptr<TB>(), layout_of(b, "b"), o.mutable_data_ptr<TO>(),
          layout_of(o, "out"), qa, qb, qo, relu, AtenParallel{});
}

at::Tensor& binary_out(
    const char* op, bool relu, const at::Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
    const at::Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax, double o_scale, int64_t o_zp,
    int64_t o_qmin, int64_t o_qmax, at::Tensor& out) {
  check_cpu(op, "a", a);
  check_cpu(op, "b", b);
  check_cpu(op, "out", out);
  const qc::QType ta = qtype_of(op, "a", a.scalar_type());
  TORCH_CHECK(b.scalar_type() == a.scalar_type() && out.scalar_type() == a.scalar_type(), op,
              ": a, b and out must share one dtype, got ", a.scalar_type(), ", ", b.scalar_type(), ", ",
              out.scalar_type());
  const qc::QParams qa = qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, ta);
  const qc::QParams qb = qparams(op, "b", b_scale, b_zp, b_qmin, b_qmax, ta);
  const qc::QParams qo = qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, ta);
  const Layout la = layout_of(a, "a"), lb = layout_of(b, "b");
  Status st;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  TORCH_CHECK(core::broadcast_shapes(la, lb, ndim, sizes, op, st), st.msg);
  at::native::resize_output(out, at::IntArrayRef(sizes, ndim));
  return into(out, {&a, &b}, [&](at::Tensor& dst) {
    if (ta == qc::QType::kInt8) {
      dispatch_add<int8_t, int8_t, int8_t>(a, b, dst, qa, qb, qo, relu);
    } else {
      dispatch_add<uint8_t, uint8_t, uint8_t>(a, b, dst, qa, qb, qo, relu);
    }
  });
}

at::Tensor& add_out(const at::Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                    const at::Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax, double o_scale,
                    int64_t o_zp, int64_t o_qmin, int64_t o_qmax, at::Tensor& out) {
  return binary_out("quantized_decomposed::add.out", false, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale, b_zp, b_qmin,
                    b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

at::Tensor& add_relu_out(const at::Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                         const at::Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax,
                         double o_scale, int64_t o_zp, int64_t o_qmin, int64_t o_qmax, at::Tensor& out) {
  return binary_out("quantized_decomposed::add_relu.out", true, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale, b_zp,
                    b_qmin, b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

template <class TA, class TO>
void dispatch_scalar(const at::Tensor& a, at::Tensor& o, const qc::QParams& qa, double b, const qc::QParams& qo) {
  qc::add_scalar(a.const_data_ptr<TA>(), layout_of(a, "qa"), o.mutable_data_ptr<TO>(), layout_of(o, "out"), qa, b, qo,
                 AtenParallel{});
}

at::Tensor& add_scalar_out(const at::Tensor& qa, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                           at::ScalarType a_dtype, const at::Scalar& b, double o_scale, int64_t o_zp, int64_t o_qmin,
                           int64_t o_qmax, at::ScalarType o_dtype, at::Tensor& out) {
  constexpr const char* op = "quantized_decomposed::add.scalar_out";
  check_cpu(op, "qa", qa);
  check_cpu(op, "out", out);
  TORCH_CHECK(qa.scalar_type() == a_dtype, op, ": qa has dtype ", qa.scalar_type(), " but a_dtype is ", a_dtype);
  TORCH_CHECK(out.scalar_type() == o_dtype, op, ": out has dtype ", out.scalar_type(), " but out_dtype is ", o_dtype);
  TORCH_CHECK(!b.isComplex() && !b.isBoolean(), op, ": b must be a real number");
  const qc::QType ta = qtype_of(op, "qa", a_dtype), to = qtype_of(op, "out", o_dtype);
  const qc::QParams pa = qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, ta);
  const qc::QParams po = qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, to);
  const double bv = b.toDouble();
  Status st;
  TORCH_CHECK(qc::check_scalar(op, bv, st), st.msg);
  at::native::resize_output(out, qa.sizes());
  return into(out, {&qa}, [&](at::Tensor& dst) {
    if (ta == qc::QType::kInt8) {
      to == qc::QType::kInt8 ? dispatch_scalar<int8_t, int8_t>(qa, dst, pa, bv, po)
                             : dispatch_scalar<int8_t, uint8_t>(qa, dst, pa, bv, po);
    } else {
      to == qc::QType::kInt8 ? dispatch_scalar<uint8_t, int8_t>(qa, dst, pa, bv, po)
                             : dispatch_scalar<uint8_t, uint8_t>(qa, dst, pa, bv, po);
    }
  });
}

at::Tensor& quantize_per_tensor_out(const at::Tensor& input, double scale, int64_t zp, int64_t qmin, int64_t qmax,
                                    at::ScalarType dtype, at::Tensor& out) {
  constexpr const char* op = "quantized_decomposed::quantize_per_tensor.out";
  check_cpu(op, "input", input);
  TORCH_CHECK(input.scalar_type() == at::kFloat, op, ": input must be float32, got ", input.scalar_type());
  TORCH_CHECK(out.scalar_type() == dtype, op, ": out has dtype ", out.scalar_type(), " but dtype is ", dtype);
  const qc::QType t = qtype_of(op, "dtype", dtype);
  const qc::QParams p = qparams(op, "input", scale, zp, qmin, qmax, t);
  at::native::resize_output(out, input.sizes());
  const at::Tensor x = input.contiguous();
  at::Tensor dst = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
  if (t == qc::QType::kInt8) {
    qc::quantize(x.const_data_ptr<float>(), dst.mutable_data_ptr<int8_t>(), x.numel(), p, AtenParallel{});
  } else {
    qc::quantize(x.const_data_ptr<float>(), dst.mutable_data_ptr<uint8_t>(), x.numel(), p, AtenParallel{});
  }
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

at::Tensor& dequantize_per_tensor_out(const at::Tensor& input, double scale, int64_t zp, int64_t qmin, int64_t qmax,
                                      at::ScalarType dtype, std::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  constexpr const char* op = "quantized_decomposed::dequantize_per_tensor.out";
  check_cpu(op, "input", input);
  TORCH_CHECK(input.scalar_type() == dtype, op, ": input has dtype ", input.scalar_type(), " but dtype is ", dtype);
  TORCH_CHECK(!out_dtype.has_value() || *out_dtype == at::kFloat, op, ": only float32 output is supported");
  TORCH_CHECK(out.scalar_type() == at::kFloat, op, ": out must be float32, got ", out.scalar_type());
  const qc::QType t = qtype_of(op, "dtype", dtype);
  const qc::QParams p = qparams(op, "input", scale, zp, qmin, qmax, t);
  at::native::resize_output(out, input.sizes());
  const at::Tensor q = input.contiguous();
  at::Tensor dst = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
  if (t == qc::QType::kInt8) {
    qc::dequantize(q.const_data_ptr<int8_t>(), dst.mutable_data_ptr<float>(), q.numel(), p, AtenParallel{});
  } else {
    qc::dequantize(q.const_data_ptr<uint8_t>(), dst.mutable_data_ptr<float>(), q.numel(), p, AtenParallel{});
  }
  if (!dst.is_same(out)) out.copy_(dst);
  return out;
}

at::Tensor& embedding_byte_out(const at::Tensor& weight, const at::Tensor& scales, const std::optional<at::Tensor>& zps,
                               int64_t qmin, int64_t qmax, const at::Tensor& indices, at::Tensor& out) {
  constexpr const char* op = "quantized_decomposed::embedding_byte.out";
  check_cpu(op, "weight", weight);
  check_cpu(op, "weight_scales", scales);
  check_cpu(op, "indices", indices);
  const qc::QType tw = qtype_of(op, "weight", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be [N, D], got rank ", weight.dim());
  TORCH_CHECK(qmin <= qmax && qmin >= qc::qtype_min(tw) && qmax <= qc::qtype_max(tw), op, ": quant range [", qmin, ", ",
              qmax, "] is not inside the weight dtype's");
  const int64_t n = weight.size(0), d = weight.size(1);
  TORCH_CHECK(scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf, op,
              ": weight_scales must be float32 or float16, got ", scales.scalar_type());
  TORCH_CHECK(scales.numel() == n && (scales.dim() == 1 || (scales.dim() == 2 && scales.size(1) == 1)), op,
              ": weight_scales must be [N] or [N, 1] (per row), got ", scales.sizes());
  const bool has_zp = zps.has_value() && zps->defined();
  if (has_zp) {
    TORCH_CHECK(zps->numel() == n && (zps->dim() == 1 || (zps->dim() == 2 && zps->size(1) == 1)), op,
                ": weight_zero_points must be [N] or [N, 1], got ", zps->sizes());
  }
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
              ": indices must be int64 or int32, got ", indices.scalar_type());
  TORCH_CHECK(out.scalar_type() == scales.scalar_type(), op, ": out must have the scales' dtype ",
              scales.scalar_type(), ", got ", out.scalar_type());
  const at::Tensor s = scales.to(at::kFloat).contiguous();
  const at::Tensor z = has_zp ? zps->to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
  shape.push_back(d);
  at::native::resize_output(out, shape);
  qc::EmbeddingArgs e;
  e.weight = weight.const_data_ptr();
  e.wtype = tw;
  e.rows = n;
  e.dim = d;
  e.w_stride0 = weight.stride(0);
  e.w_stride1 = weight.stride(1);
  e.scales = s.const_data_ptr<float>();
  e.zero_points = has_zp ? z.const_data_ptr<float>() : nullptr;
  e.indices = idx.const_data_ptr<int64_t>();
  e.num_indices = idx.numel();
  e.half_out = out.scalar_type() == at::kHalf;
  Status st;
  TORCH_CHECK(qc::check_indices(e, st), st.msg);
  return into(out, {&weight, &scales, has_zp ? &*zps : nullptr, &indices}, [&](at::Tensor& dst) {
    at::Tensor c = dst.is_contiguous() ? dst : at::empty(dst.sizes(), dst.options());
    e.out = c.mutable_data_ptr();
    qc::embedding_byte(e, AtenParallel{});
    if (!c.is_same(dst)) dst.copy_(c);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(quantized_decomposed, CPU, m) {
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("add_relu.out", TORCH_FN(add_relu_out));
  m.impl("add.scalar_out", TORCH_FN(add_scalar_out));
  m.impl("quantize_per_tensor.out", TORCH_FN(quantize_per_tensor_out));
  m.impl("dequantize_per_tensor.out", TORCH_FN(dequantize_per_tensor_out));
  m.impl("embedding_byte.out", TORCH_FN(embedding_byte_out));
}
