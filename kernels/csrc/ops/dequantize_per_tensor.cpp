// quantized_decomposed::dequantize_per_tensor.out: (q - zp) * scale, int8/uint8 in, float32 out
// (core/quantized.h). Registered as etfuse::quantized_decomposed_* (see quantized_add.cpp).
#include "ops/quantized_args.h"

namespace {

using namespace etfuse::adapter;

Tensor& dequantize_per_tensor_out(Context& ctx, const Tensor& input, double scale, int64_t zp, int64_t qmin,
                                  int64_t qmax, ScalarType dtype, std::optional<ScalarType> out_dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::dequantize_per_tensor.out";
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams p;
  Out o(out);
  Input q(input);
  bool ok = check_cpu(op, "input", input, st);
  if (ok && input.scalar_type() != dtype) {
    ok = st.fail("%s: input has dtype %s but dtype is %s", op, dtype_name(input.scalar_type()), dtype_name(dtype));
  }
  if (ok && out_dtype.has_value() && *out_dtype != ScalarType::Float) {
    ok = st.fail("%s: only float32 output is supported", op);
  }
  if (ok && out.scalar_type() != ScalarType::Float) {
    ok = st.fail("%s: out must be float32, got %s", op, dtype_name(out.scalar_type()));
  }
  ok = ok && per_tensor_args(op, input, dtype, scale, zp, qmin, qmax, t, p, q, o, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  with_qtype(t, [&](auto tag) {
    using T = decltype(tag);
    qc::dequantize(q.data<T>(), o.data<float>(), q.layout().numel(), p, Parallel{});
  });
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_decomposed_dequantize_per_tensor.out", dequantize_per_tensor_out);
