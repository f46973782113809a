// quantized_decomposed::add.out, add_relu.out and add.scalar_out: q(dq(a) + dq(b)) [relu],
// per-tensor qparams, broadcasting, int8/uint8 (core/quantized.h). Registered under etfuse's own
// names (etfuse::quantized_decomposed_add.out, ...), which a .pte calls (backend_ops/runtime_names.py):
// executorch's stock quantized kernels register quantized_decomposed::add.out and the runtime aborts
// on a duplicate, so both libraries can be linked into one app.
#include "ops/quantized_args.h"

namespace {

using namespace etfuse::adapter;
namespace core = etfuse::core;

Tensor& binary_out(Context& ctx, const char* op, bool relu, const Tensor& a, double a_scale, int64_t a_zp,
                   int64_t a_qmin, int64_t a_qmax, const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin,
                   int64_t b_qmax, double o_scale, int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams qa, qb, qo;
  Layout la, lb;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  bool ok = check_cpu(op, "a", a, st) && check_cpu(op, "b", b, st) && check_cpu(op, "out", out, st) &&
      qtype_of(op, "a", a.scalar_type(), t, st);
  if (ok && (b.scalar_type() != a.scalar_type() || out.scalar_type() != a.scalar_type())) {
    ok = st.fail("%s: a, b and out must share one dtype, got %s, %s, %s", op, dtype_name(a.scalar_type()),
                 dtype_name(b.scalar_type()), dtype_name(out.scalar_type()));
  }
  ok = ok && qc::make_qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, t, qa, st) &&
      qc::make_qparams(op, "b", b_scale, b_zp, b_qmin, b_qmax, t, qb, st) &&
      qc::make_qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, t, qo, st) && layout_of(a, "a", la, st) &&
      layout_of(b, "b", lb, st) && core::broadcast_shapes(la, lb, ndim, sizes, op, st) &&
      o.resize(op, ndim, sizes, st) && qc::check_out_shape(op, la, lb, o.layout(), st) &&
      o.open({&a, &b}, true, true, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  with_qtype(t, [&](auto tag) {
    using T = decltype(tag);
    qc::add(a.const_data_ptr<T>(), la, b.const_data_ptr<T>(), lb, o.data<T>(), o.write_layout(), qa, qb, qo, relu,
            Parallel{});
  });
  return o.finish();
}

Tensor& add_out(Context& ctx, const Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax, double o_scale,
                int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  return binary_out(ctx, "quantized_decomposed::add.out", false, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale, b_zp,
                    b_qmin, b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

Tensor& add_relu_out(Context& ctx, const Tensor& a, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                     const Tensor& b, double b_scale, int64_t b_zp, int64_t b_qmin, int64_t b_qmax, double o_scale,
                     int64_t o_zp, int64_t o_qmin, int64_t o_qmax, Tensor& out) {
  return binary_out(ctx, "quantized_decomposed::add_relu.out", true, a, a_scale, a_zp, a_qmin, a_qmax, b, b_scale,
                    b_zp, b_qmin, b_qmax, o_scale, o_zp, o_qmin, o_qmax, out);
}

Tensor& add_scalar_out(Context& ctx, const Tensor& qa, double a_scale, int64_t a_zp, int64_t a_qmin, int64_t a_qmax,
                       ScalarType a_dtype, const Scalar& b, double o_scale, int64_t o_zp, int64_t o_qmin,
                       int64_t o_qmax, ScalarType o_dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::add.scalar_out";
  Status st;
  qc::QType ta = qc::QType::kInt8, to = qc::QType::kInt8;
  qc::QParams pa, po;
  Layout la;
  Out o(out);
  bool ok = check_cpu(op, "qa", qa, st) && check_cpu(op, "out", out, st);
  if (ok && qa.scalar_type() != a_dtype) {
    ok = st.fail("%s: qa has dtype %s but a_dtype is %s", op, dtype_name(qa.scalar_type()), dtype_name(a_dtype));
  }
  if (ok && out.scalar_type() != o_dtype) {
    ok = st.fail("%s: out has dtype %s but out_dtype is %s", op, dtype_name(out.scalar_type()), dtype_name(o_dtype));
  }
  if (ok && !scalar_is_real(b)) ok = st.fail("%s: b must be a real number", op);
  ok = ok && qtype_of(op, "qa", a_dtype, ta, st) && qtype_of(op, "out", o_dtype, to, st) &&
      qc::make_qparams(op, "a", a_scale, a_zp, a_qmin, a_qmax, ta, pa, st) &&
      qc::make_qparams(op, "out", o_scale, o_zp, o_qmin, o_qmax, to, po, st);
  const double bv = ok ? scalar_value(b) : 0.0;
  ok = ok && qc::check_scalar(op, bv, st) && layout_of(qa, "qa", la, st) && o.resize(op, la.ndim, la.sizes, st) &&
      o.open({&qa}, true, true, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  with_qtype(ta, [&](auto ta_tag) {
    with_qtype(to, [&](auto to_tag) {
      using TA = decltype(ta_tag);
      using TO = decltype(to_tag);
      qc::add_scalar(qa.const_data_ptr<TA>(), la, o.data<TO>(), o.write_layout(), pa, bv, po, Parallel{});
    });
  });
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_decomposed_add.out", add_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_add_relu.out", add_relu_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_add.scalar_out", add_scalar_out);
