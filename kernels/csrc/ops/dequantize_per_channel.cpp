// quantized_decomposed::dequantize_per_channel.out: (q - zp[c]) * scale[c] along `axis`, int8/uint8
// in, float32 out: what a PT2E weight leaves where no quantized rule fused its conv/linear.
// Registered as etfuse::quantized_decomposed_* (see quantized_add.cpp).
#include <vector>

#include "ops/quantized_args.h"

namespace {

using namespace etfuse::adapter;

template <class T>
void dequantize_channels(const T* q, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                         const float* zp, float* out) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const T* src = q + (o * channels + c) * inner;
      float* dst = out + (o * channels + c) * inner;
      const float s = scale[c], z = zp ? zp[c] : 0.0f;
      for (int64_t i = 0; i < inner; ++i) dst[i] = (static_cast<float>(src[i]) - z) * s;
    }
  }
}

Tensor& dequantize_per_channel_out(Context& ctx, const Tensor& input, const Tensor& scales,
                                   const OptTensor& zero_points, int64_t axis, int64_t qmin, int64_t qmax,
                                   ScalarType dtype, std::optional<ScalarType> out_dtype, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::dequantize_per_channel.out";
  (void)qmin;
  (void)qmax;  // metadata, as in torch.ao's op
  Status st;
  qc::QType t = qc::QType::kInt8;
  Layout li;
  Out o(out);
  std::vector<float> scale, zp;
  bool ok = check_cpu(op, "input", input, st) && qtype_of(op, "dtype", dtype, t, st) &&
      layout_of(input, "input", li, st);
  if (ok && input.scalar_type() != dtype) {
    ok = st.fail("%s: input has dtype %s but dtype is %s", op, dtype_name(input.scalar_type()), dtype_name(dtype));
  }
  if (ok && (out.scalar_type() != ScalarType::Float || (out_dtype.has_value() && *out_dtype != ScalarType::Float))) {
    ok = st.fail("%s: only float32 output is supported", op);
  }
  if (ok && (axis < -li.ndim || axis >= li.ndim || li.ndim == 0)) {
    ok = st.fail("%s: axis %lld is out of range for a %d-D input", op, (long long)axis, li.ndim);
  }
  if (ok && scales.scalar_type() != ScalarType::Float) {
    ok = st.fail("%s: scales must be float32, got %s", op, dtype_name(scales.scalar_type()));
  }
  const int a = ok ? static_cast<int>(axis < 0 ? axis + li.ndim : axis) : 0;
  const int64_t channels = ok ? li.sizes[a] : 0;
  ok = ok && row_values(op, "scales", scales, channels, scale, st) &&
      (!has(zero_points) || row_values(op, "zero_points", *zero_points, channels, zp, st)) &&
      o.resize(op, li.ndim, li.sizes, st) && o.open({&input}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  Input q(input);
  q.read(li, !is_contiguous(li));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= li.sizes[d];
  for (int d = a + 1; d < li.ndim; ++d) inner *= li.sizes[d];
  with_qtype(t, [&](auto tag) {
    dequantize_channels(q.data<decltype(tag)>(), outer, channels, inner, scale.data(), zp.empty() ? nullptr : zp.data(),
                        o.data<float>());
  });
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_decomposed_dequantize_per_channel.out", dequantize_per_channel_out);
