// quantized_decomposed::embedding_byte.out: rows of an int8/uint8 [N, D] table, dequantized per
// row (scale, optional zero point), float32 or float16 out (core/quantized.h). In the quantized
// runtime library (see quantized_add.cpp).
#include "ops/quantized_args.h"

namespace {

using namespace etfuse::adapter;
namespace core = etfuse::core;

Tensor& embedding_byte_out(Context& ctx, const Tensor& weight, const Tensor& scales, const OptTensor& zps,
                           int64_t qmin, int64_t qmax, const Tensor& indices, Tensor& out) {
  constexpr const char* op = "quantized_decomposed::embedding_byte.out";
  Status st;
  qc::QType tw = qc::QType::kInt8;
  const bool has_zp = has(zps);
  bool ok = check_cpu(op, "weight", weight, st) && check_cpu(op, "weight_scales", scales, st) &&
      check_cpu(op, "indices", indices, st) && qtype_of(op, "weight", weight.scalar_type(), tw, st);
  if (ok && weight.dim() != 2) ok = st.fail("%s: weight must be [N, D], got rank %lld", op, (long long)weight.dim());
  if (ok && (qmin > qmax || qmin < qc::qtype_min(tw) || qmax > qc::qtype_max(tw))) {
    ok = st.fail("%s: quant range [%lld, %lld] is not inside the weight dtype's", op, (long long)qmin, (long long)qmax);
  }
  if (ok && scales.scalar_type() != ScalarType::Float && scales.scalar_type() != ScalarType::Half) {
    ok = st.fail("%s: weight_scales must be float32 or float16, got %s", op, dtype_name(scales.scalar_type()));
  }
  if (ok && indices.scalar_type() != ScalarType::Long && indices.scalar_type() != ScalarType::Int) {
    ok = st.fail("%s: indices must be int64 or int32, got %s", op, dtype_name(indices.scalar_type()));
  }
  if (ok && out.scalar_type() != scales.scalar_type()) {
    ok = st.fail("%s: out must have the scales' dtype %s, got %s", op, dtype_name(scales.scalar_type()),
                 dtype_name(out.scalar_type()));
  }
  if (ok && indices.dim() + 1 > core::kMaxDims) ok = st.fail("%s: indices have too many dims", op);
  const int64_t n = ok ? weight.size(0) : 0, d = ok ? weight.size(1) : 0;
  std::vector<float> s, z;
  ok = ok && row_values(op, "weight_scales", scales, n, s, st) &&
      (!has_zp || row_values(op, "weight_zero_points", *zps, n, z, st));
  std::vector<int64_t> idx;
  Layout lidx;
  ok = ok && layout_of(indices, "indices", lidx, st);
  if (ok) {
    idx.resize(static_cast<size_t>(lidx.numel()));
    Input in(indices, lidx);
    if (!is_contiguous(lidx)) in.make_contiguous();
    if (indices.scalar_type() == ScalarType::Long) {
      const int64_t* p = in.data<int64_t>();
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = p[i];
    } else {
      const int32_t* p = in.data<int32_t>();
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = p[i];
    }
  }
  qc::EmbeddingArgs e;
  e.rows = n;
  e.indices = idx.data();
  e.num_indices = static_cast<int64_t>(idx.size());
  ok = ok && qc::check_indices(e, st);
  Out o(out);
  if (ok) {
    int64_t sizes[core::kMaxDims];
    for (int k = 0; k < lidx.ndim; ++k) sizes[k] = lidx.sizes[k];
    sizes[lidx.ndim] = d;
    ok = o.resize(op, lidx.ndim + 1, sizes, st) &&
        o.open({&weight, &scales, has_zp ? &*zps : nullptr, &indices}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  e.weight = weight.const_data_ptr();
  e.wtype = tw;
  e.dim = d;
  e.w_stride0 = weight.strides()[0];
  e.w_stride1 = weight.strides()[1];
  e.scales = s.data();
  e.zero_points = has_zp ? z.data() : nullptr;
  e.out = o.raw();
  e.half_out = out.scalar_type() == ScalarType::Half;
  qc::embedding_byte(e, Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(quantized_decomposed, "embedding_byte.out", embedding_byte_out);
