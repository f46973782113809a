// quantized_decomposed::quantize_per_tensor.out: clamp(rint(x / scale) + zp), float32 in,
// int8/uint8 out (core/quantized.h). Registered as etfuse::quantized_decomposed_* (see quantized_add.cpp).
#include "ops/quantized_args.h"

namespace {

using namespace etfuse::adapter;

Tensor& quantize_per_tensor_out(Context& ctx, const Tensor& input, double scale, int64_t zp, int64_t qmin,
                                int64_t qmax, ScalarType dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::quantize_per_tensor.out";
  Status st;
  qc::QType t = qc::QType::kInt8;
  qc::QParams p;
  Out o(out);
  Input x(input);
  bool ok = check_cpu(op, "input", input, st);
  if (ok && input.scalar_type() != ScalarType::Float) {
    ok = st.fail("%s: input must be float32, got %s", op, dtype_name(input.scalar_type()));
  }
  if (ok && out.scalar_type() != dtype) {
    ok = st.fail("%s: out has dtype %s but dtype is %s", op, dtype_name(out.scalar_type()), dtype_name(dtype));
  }
  ok = ok && per_tensor_args(op, input, dtype, scale, zp, qmin, qmax, t, p, x, o, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  with_qtype(t, [&](auto tag) {
    using T = decltype(tag);
    qc::quantize(x.data<float>(), o.data<T>(), x.layout().numel(), p, Parallel{});
  });
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_decomposed_quantize_per_tensor.out", quantize_per_tensor_out);
