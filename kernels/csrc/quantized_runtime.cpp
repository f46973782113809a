// ExecuTorch runtime registration of the quantized kernel cores (core/quantized.h).
//
// Its own library (libetfuse_quantized_runtime.so): executorch's stock quantized kernels
// (libexecutorch_kernels_quantized.so, loaded by `import executorch.kernels.quantized`) register
// some of the same names (add.out, embedding_byte.out, quantize/dequantize_per_tensor.out), and
// the runtime aborts on a second registration, so etfuse.kernels loads this library only when
// none of these names is registered yet. Bad qparams/shapes fail the kernel through
// ET_KERNEL_CHECK_MSG: Method.execute raises in Python, the process lives on.
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <optional>
#include <vector>

#include "core/quantized.h"
#include "runtime_common.h"

namespace core = etfuse::core;
namespace qc = etfuse::core::quantized;

namespace {

using core::Layout;
using core::Status;
using executorch::aten::ScalarType;
using executorch::aten::Scalar;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

using etfuse::runtime::EtParallel;
using etfuse::runtime::layout_of;

bool qtype_of(const char* op, const char* name, ScalarType t, qc::QType& q, Status& st) {
  if (t == ScalarType::Char) {
    q = qc::QType::kInt8;
    return true;
  }
  if (t == ScalarType::Byte) {
    q = qc::QType::kUInt8;
    return true;
  }
  return st.fail("%s: %s must be int8 or uint8, got %s", op, name, executorch::runtime::toString(t));
}

bool same_dtype(const char* op, const Tensor& a, const Tensor& b, const char* an, const char* bn, Status& st) {
  if (a.scalar_type() == b.scalar_type()) return true;
  return st.fail("%s: %s and %s must share one dtype, got %s and %s", op, an, bn,
                 executorch::runtime::toString(a.scalar_type()), executorch::runtime::toString(b.scalar_type()));
}

bool resize_out(const char* op, Tensor& out, int ndim, const int64_t* sizes, Layout& lo, Status& st) {
  const Error err = executorch::runtime::resize_tensor(out, executorch::aten::ArrayRef<int64_t>(sizes, ndim));
  if (err != Error::Ok) {
    Layout cur;
    Status ignore;
    layout_of(out, "out", cur, ignore);
    return st.fail("%s: cannot resize out from %s to %s", op, core::ShapeStr(cur).c_str(),
                   core::ShapeStr(sizes, ndim).c_str());
  }
  return layout_of(out, "out", lo, st);
}

Tensor& binary_out(KernelRuntimeContext& ctx, const char* op, bool relu, const Tensor& a, double a_scale, int64_t a_zp,
                   int64_t a_qmin, int64_t a_qmax, const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin,
                   int64_t b_qmax, double o_scale, int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams qa, qb, qo;
  Layout la, lb, lo;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  const bool ok = qtype_of(op, "a", a.scalar_type(), t, st) && same_dtype(op, a, b, "a", "b", st) &&
      same_dtype(op, a, out, "a", "out", st) && qc::make_qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, t, qa, st) &&
      qc::make_qparams(op, "b", b_scale, b_zp, b_qmin, b_qmax, t, qb, st) &&
      qc::make_qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, t, qo, st) && layout_of(a, "a", la, st) &&
      layout_of(b, "b", lb, st) && core::broadcast_shapes(la, lb, ndim, sizes, op, st) &&
      resize_out(op, out, ndim, sizes, lo, st) && qc::check_out_shape(op, la, lb, lo, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  if (t == qc::QType::kInt8) {
    qc::add(a.const_data_ptr<int8_t>(), la, b.const_data_ptr<int8_t>(), lb, out.mutable_data_ptr<int8_t>(), lo, qa, qb,
            qo, relu, EtParallel{});
  } else {
    qc::add(a.const_data_ptr<uint8_t>(), la, b.const_data_ptr<uint8_t>(), lb, out.mutable_data_ptr<uint8_t>(), lo, qa,
            qb, qo, relu, EtParallel{});
  }
  return out;
}

Tensor& add_out(KernelRuntimeContext& ctx, const Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin,
                int64_t a_qmax, const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax,
                double o_scale, int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  return binary_out(ctx, "quantized_decomposed::add.out", false, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale, b_zp,
                    b_qmin, b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

Tensor& add_relu_out(KernelRuntimeContext& ctx, const Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin,
                     int64_t a_qmax, const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax,
                     double o_scale, int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  return binary_out(ctx, "quantized_decomposed::add_relu.out", true, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale, b_zp,
                    b_qmin, b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

Tensor& add_scalar_out(KernelRuntimeContext& ctx, const Tensor& qa, double a_scale, int64_t a_zp, int64_t a_qmin,
                       int64_t a_qmax, ScalarType a_dtype, const Scalar& b, double o_scale, int64_t o_zp,
                       int64_t o_qmin, int64_t o_qmax, ScalarType o_dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::add.scalar_out";
  Status st;
  qc::QType ta = qc::QType::kInt8, to = qc::QType::kInt8;
  qc::QParams pa, po;
  Layout la, lo;
  int64_t sizes[core::kMaxDims];
  bool ok = qtype_of(op, "a_dtype", a_dtype, ta, st) && qtype_of(op, "out_dtype", o_dtype, to, st);
  if (ok && (qa.scalar_type() != a_dtype || out.scalar_type() != o_dtype)) {
    ok = st.fail("%s: qa/out dtypes (%s, %s) differ from a_dtype/out_dtype", op,
                 executorch::runtime::toString(qa.scalar_type()), executorch::runtime::toString(out.scalar_type()));
  }
  if (ok && !b.isFloatingPoint() && !b.isIntegral(false)) ok = st.fail("%s: b must be a real number", op);
  ok = ok && qc::make_qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, ta, pa, st) &&
      qc::make_qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, to, po, st) && layout_of(qa, "qa", la, st);
  if (ok) {
    for (int d = 0; d < la.ndim; ++d) sizes[d] = la.sizes[d];
    ok = resize_out(op, out, la.ndim, sizes, lo, st) && qc::check_out_shape(op, la, Layout{}, lo, st);
  }
  const double bv = ok ? (b.isFloatingPoint() ? b.to<double>() : static_cast<double>(b.to<int64_t>())) : 0.0;
  ok = ok && qc::check_scalar(op, bv, st);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  if (ta == qc::QType::kInt8) {
    if (to == qc::QType::kInt8) {
      qc::add_scalar(qa.const_data_ptr<int8_t>(), la, out.mutable_data_ptr<int8_t>(), lo, pa, bv, po, EtParallel{});
    } else {
      qc::add_scalar(qa.const_data_ptr<int8_t>(), la, out.mutable_data_ptr<uint8_t>(), lo, pa, bv, po, EtParallel{});
    }
  } else {
    if (to == qc::QType::kInt8) {
      qc::add_scalar(qa.const_data_ptr<uint8_t>(), la, out.mutable_data_ptr<int8_t>(), lo, pa, bv, po, EtParallel{});
    } else {
      qc::add_scalar(qa.const_data_ptr<uint8_t>(), la, out.mutable_data_ptr<uint8_t>(), lo, pa, bv, po, EtParallel{});
    }
  }
  return out;
}

bool is_contiguous(const Layout& l) {
  int64_t expect = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    if (l.sizes[d] != 1 && l.strides[d] != expect) return false;
    expect *= l.sizes[d];
  }
  return true;
}

Tensor& quantize_per_tensor_out(KernelRuntimeContext& ctx, const Tensor& input, double scale, int64_t zp, int64_t qmin,
                                int64_t qmax, ScalarType dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::quantize_per_tensor.out";
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams p;
  Layout li, lo;
  bool ok = qtype_of(op, "dtype", dtype, t, st);
  if (ok && input.scalar_type() != ScalarType::Float) ok = st.fail("%s: input must be float32", op);
  if (ok && out.scalar_type() != dtype) ok = st.fail("%s: out dtype differs from dtype", op);
  ok = ok && qc::make_qparams(op, "input", scale, zp, qmin, qmax, t, p, st) && layout_of(input, "input", li, st) &&
      resize_out(op, out, li.ndim, li.sizes, lo, st);
  if (ok && !(is_contiguous(li) && is_contiguous(lo))) ok = st.fail("%s: tensors must be contiguous", op);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  if (t == qc::QType::kInt8) {
    qc::quantize(input.const_data_ptr<float>(), out.mutable_data_ptr<int8_t>(), input.numel(), p, EtParallel{});
  } else {
    qc::quantize(input.const_data_ptr<float>(), out.mutable_data_ptr<uint8_t>(), input.numel(), p, EtParallel{});
  }
  return out;
}

Tensor& dequantize_per_tensor_out(KernelRuntimeContext& ctx, const Tensor& input, double scale, int64_t zp,
                                  int64_t qmin, int64_t qmax, ScalarType dtype, std::optional<ScalarType> out_dtype,
                                  Tensor& out) {
  constexpr const char* op = "quantized_decomposed::dequantize_per_tensor.out";
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams p;
  Layout li, lo;
  bool ok = qtype_of(op, "dtype", dtype, t, st);
  if (ok && input.scalar_type() != dtype) ok = st.fail("%s: input dtype differs from dtype", op);
  if (ok && ((out_dtype.has_value() && *out_dtype != ScalarType::Float) || out.scalar_type() != ScalarType::Float)) {
    ok = st.fail("%s: only float32 output is supported", op);
  }
  ok = ok && qc::make_qparams(op, "input", scale, zp, qmin, qmax, t, p, st) && layout_of(input, "input", li, st) &&
      resize_out(op, out, li.ndim, li.sizes, lo, st);
  if (ok && !(is_contiguous(li) && is_contiguous(lo))) ok = st.fail("%s: tensors must be contiguous", op);
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  if (t == qc::QType::kInt8) {
    qc::dequantize(input.const_data_ptr<int8_t>(), out.mutable_data_ptr<float>(), input.numel(), p, EtParallel{});
  } else {
    qc::dequantize(input.const_data_ptr<uint8_t>(), out.mutable_data_ptr<float>(), input.numel(), p, EtParallel{});
  }
  return out;
}

// Reads element i of a 1-element-per-row tensor of any real dtype as float.
bool row_values(const char* op, const char* name, const Tensor& t, int64_t n, std::vector<float>& out, Status& st) {
  if (t.numel() != n || !(t.dim() == 1 || (t.dim() == 2 && t.size(1) == 1))) {
    return st.fail("%s: %s must be [N] or [N, 1] with N = %lld rows", op, name, (long long)n);
  }
  const int64_t stride = t.strides()[0];
  out.resize(static_cast<size_t>(n));
  switch (t.scalar_type()) {
#define ETFUSE_ROWS(CT, ST) \
  case ScalarType::ST: {    \
    const CT* p = t.const_data_ptr<CT>(); \
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i * stride]); \
    return true;            \
  }
    ETFUSE_ROWS(float, Float)
    ETFUSE_ROWS(executorch::aten::Half, Half)
    ETFUSE_ROWS(double, Double)
    ETFUSE_ROWS(int8_t, Char)
    ETFUSE_ROWS(uint8_t, Byte)
    ETFUSE_ROWS(int32_t, Int)
    ETFUSE_ROWS(int64_t, Long)
#undef ETFUSE_ROWS
    default:
      return st.fail("%s: %s has unsupported dtype %s", op, name, executorch::runtime::toString(t.scalar_type()));
  }
}

Tensor& embedding_byte_out(KernelRuntimeContext& ctx, const Tensor& weight, const Tensor& scales,
                           const std::optional<Tensor>& zps, int64_t qmin, int64_t qmax, const Tensor& indices,
                           Tensor& out) {
  constexpr const char* op = "quantized_decomposed::embedding_byte.out";
  Status st;
  qc::QType tw = qc::QType::kInt8;
  bool ok = qtype_of(op, "weight", weight.scalar_type(), tw, st);
  if (ok && weight.dim() != 2) ok = st.fail("%s: weight must be [N, D]", op);
  if (ok && (qmin > qmax || qmin < qc::qtype_min(tw) || qmax > qc::qtype_max(tw))) {
    ok = st.fail("%s: quant range [%lld, %lld] is not inside the weight dtype's", op, (long long)qmin, (long long)qmax);
  }
  if (ok && scales.scalar_type() != ScalarType::Float && scales.scalar_type() != ScalarType::Half) {
    ok = st.fail("%s: weight_scales must be float32 or float16", op);
  }
  if (ok && out.scalar_type() != scales.scalar_type()) ok = st.fail("%s: out must have the scales' dtype", op);
  if (ok && indices.scalar_type() != ScalarType::Long && indices.scalar_type() != ScalarType::Int) {
    ok = st.fail("%s: indices must be int64 or int32", op);
  }
  if (ok && indices.dim() + 1 > core::kMaxDims) ok = st.fail("%s: indices have too many dims", op);
  const int64_t n = ok ? weight.size(0) : 0, d = ok ? weight.size(1) : 0;
  std::vector<float> s, z;
  const bool has_zp = zps.has_value();
  ok = ok && row_values(op, "weight_scales", scales, n, s, st) &&
      (!has_zp || row_values(op, "weight_zero_points", *zps, n, z, st));
  std::vector<int64_t> idx;
  Layout lo;
  if (ok) {
    idx.resize(static_cast<size_t>(indices.numel()));
    if (indices.scalar_type() == ScalarType::Long) {
      const int64_t* p = indices.const_data_ptr<int64_t>();
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = p[i];
    } else {
      const int32_t* p = indices.const_data_ptr<int32_t>();
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = p[i];
    }
    int64_t sizes[core::kMaxDims];
    for (int k = 0; k < indices.dim(); ++k) sizes[k] = indices.size(k);
    sizes[indices.dim()] = d;
    ok = resize_out(op, out, static_cast<int>(indices.dim()) + 1, sizes, lo, st);
    if (ok && !is_contiguous(lo)) ok = st.fail("%s: out must be contiguous", op);
  }
  qc::EmbeddingArgs e;
  if (ok) {
    e.weight = weight.const_data_ptr();
    e.wtype = tw;
    e.rows = n;
    e.dim = d;
    e.w_stride0 = weight.strides()[0];
    e.w_stride1 = weight.strides()[1];
    e.scales = s.data();
    e.zero_points = has_zp ? z.data() : nullptr;
    e.indices = idx.data();
    e.num_indices = static_cast<int64_t>(idx.size());
    e.out = out.mutable_data_ptr();
    e.half_out = out.scalar_type() == ScalarType::Half;
    ok = qc::check_indices(e, st);
  }
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s", st.msg);
  qc::embedding_byte(e, EtParallel{});
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(quantized_decomposed, "add.out", add_out);
EXECUTORCH_LIBRARY(quantized_decomposed, "add_relu.out", add_relu_out);
EXECUTORCH_LIBRARY(quantized_decomposed, "add.scalar_out", add_scalar_out);
EXECUTORCH_LIBRARY(quantized_decomposed, "quantize_per_tensor.out", quantize_per_tensor_out);
EXECUTORCH_LIBRARY(quantized_decomposed, "dequantize_per_tensor.out", dequantize_per_tensor_out);
EXECUTORCH_LIBRARY(quantized_decomposed, "embedding_byte.out", embedding_byte_out);

ETFUSE_EXPORT const char* etfuse_quantized_runtime_isa() {
  return core::isa_name(core::selected_isa());
}

ETFUSE_EXPORT int etfuse_quantized_runtime_set_isa(const char* name) {
  return core::set_isa(name) ? 1 : 0;
}
