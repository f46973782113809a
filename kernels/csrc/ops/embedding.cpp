// quantized_decomposed::embedding_byte / embedding_4bit / embedding_2bit, `.out` and `.dtype_out`:
// rows of a quantized [N, D] table (8 bits, or 4 / 2 bits packed into uint8), dequantized per row
// or per group of columns, float32 / float16 / bfloat16 out (core/embedding.h, one core for the
// three widths). Registered as etfuse::quantized_decomposed_* (see quantized_add.cpp), and
// etfuse::embedding_{byte,4bit,2bit}_int8_zp (int8 zero points subtracted in int8, wrapping).
#include <optional>
#include <vector>

#include "adapter.h"
#include "core/embedding.h"

namespace {

using namespace etfuse::adapter;
namespace emb = etfuse::core::embedding;

bool table_type(const char* op, const char* name, ScalarType t, emb::VType& v, Status& st) {
  switch (t) {
    case ScalarType::Float: v = emb::VType::kF32; return true;
    case ScalarType::Half: v = emb::VType::kF16; return true;
    case ScalarType::BFloat16: v = emb::VType::kBF16; return true;
    case ScalarType::Double: v = emb::VType::kF64; return true;
    case ScalarType::Char: v = emb::VType::kI8; return true;
    case ScalarType::Byte: v = emb::VType::kU8; return true;
    case ScalarType::Short: v = emb::VType::kI16; return true;
    case ScalarType::Int: v = emb::VType::kI32; return true;
    case ScalarType::Long: v = emb::VType::kI64; return true;
    default: return st.fail("%s: %s has unsupported dtype %s", op, name, dtype_name(t));
  }
}

bool out_type(ScalarType t, emb::OType& o) {
  switch (t) {
    case ScalarType::Float: o = emb::OType::kF32; return true;
    case ScalarType::Half: o = emb::OType::kF16; return true;
    case ScalarType::BFloat16: o = emb::OType::kBF16; return true;
    default: return false;
  }
}

// A [N], [N, 1] or [N, G] table; `groups` is G, taken from the scales (zero points must agree).
bool table_of(const char* op, const char* name, const Tensor& t, int64_t n, int64_t& groups, emb::Table& tab,
              Status& st) {
  if (!check_cpu(op, name, t, st) || !table_type(op, name, t.scalar_type(), tab.type, st)) return false;
  const int64_t g = t.dim() == 2 ? t.size(1) : 1;
  if (!(t.dim() == 1 || t.dim() == 2) || t.size(0) != n || (groups > 0 && g != groups)) {
    Layout l;
    Status ignore;
    layout_of(t, name, l, ignore);
    return st.fail("%s: %s must be [N], [N, 1] or [N, G] (the scales' shape) for N = %lld rows, got %s", op, name,
                   (long long)n, etfuse::core::ShapeStr(l).c_str());
  }
  groups = g;
  tab.data = t.const_data_ptr();
  tab.s0 = t.strides()[0];
  tab.s1 = t.dim() == 2 ? t.strides()[1] : 0;
  return true;
}

// int8_difference: etfuse::embedding_{byte,4bit,2bit}_int8_zp (int8 zero points, q - zp wraps to int8).
Tensor& embedding_impl(Context& ctx, const char* op, int bits, const Tensor& weight, const Tensor& scales,
                       const OptTensor& zps, int64_t qmin, int64_t qmax, const Tensor& indices,
                       std::optional<ScalarType> dtype, Tensor& out, bool int8_difference = false) {
  Status st;
  const bool has_zp = has(zps);
  emb::Args e;
  e.bits = bits;
  e.int8_difference = int8_difference && has_zp;  // no zero points: embedding_byte's loop
  bool ok = check_cpu(op, "weight", weight, st) && check_cpu(op, "indices", indices, st);
  if (ok && int8_difference && bits == 8 && (weight.scalar_type() != ScalarType::Char ||
                                             (has_zp && zps->scalar_type() != ScalarType::Char))) {
    ok = st.fail("%s: weight and weight_zero_points must be int8, got %s and %s", op,
                 dtype_name(weight.scalar_type()), has_zp ? dtype_name(zps->scalar_type()) : "None");
  }
  if (ok && int8_difference && bits < 8 && has_zp && zps->scalar_type() != ScalarType::Char) {
    ok = st.fail("%s: weight_zero_points must be int8, got %s", op, dtype_name(zps->scalar_type()));
  }
  if (ok && weight.dim() != 2) ok = st.fail("%s: weight must be [N, D], got rank %lld", op, (long long)weight.dim());
  // the values a packed field holds: [-8, 7] at 4 bits, [-2, 1] at 2; 8 bits: the weight dtype's
  int64_t lo = -(int64_t(1) << (bits - 1)), hi = (int64_t(1) << (bits - 1)) - 1;
  if (ok && bits == 8) {
    if (weight.scalar_type() == ScalarType::Char) {
      e.int8_weight = true;
    } else if (weight.scalar_type() == ScalarType::Byte) {
      e.int8_weight = false, lo = 0, hi = 255;
    } else {
      ok = st.fail("%s: weight must be int8 or uint8, got %s", op, dtype_name(weight.scalar_type()));
    }
  } else if (ok && weight.scalar_type() != ScalarType::Byte) {
    ok = st.fail("%s: weight must be uint8 (%d values packed per byte), got %s", op, 8 / bits,
                 dtype_name(weight.scalar_type()));
  }
  if (ok && (qmin > qmax || qmin < lo || qmax > hi)) {
    ok = st.fail("%s: quant range [%lld, %lld] is not inside [%lld, %lld]", op, (long long)qmin, (long long)qmax,
                 (long long)lo, (long long)hi);
  }
  if (ok && scales.scalar_type() != ScalarType::Float && scales.scalar_type() != ScalarType::Half &&
      scales.scalar_type() != ScalarType::BFloat16) {
    ok = st.fail("%s: weight_scales must be float32, float16 or bfloat16, got %s", op,
                 dtype_name(scales.scalar_type()));
  }
  const ScalarType want = dtype.has_value() ? *dtype : scales.scalar_type();
  if (ok && !out_type(want, e.otype)) {
    ok = st.fail("%s: dtype must be float32, float16 or bfloat16, got %s", op, dtype_name(want));
  }
  if (ok && out.scalar_type() != want) {
    ok = st.fail("%s: out must have dtype %s, got %s", op, dtype_name(want), dtype_name(out.scalar_type()));
  }
  if (ok && indices.scalar_type() != ScalarType::Long && indices.scalar_type() != ScalarType::Int) {
    ok = st.fail("%s: indices must be int64 or int32, got %s", op, dtype_name(indices.scalar_type()));
  }
  if (ok && indices.dim() + 1 > etfuse::core::kMaxDims) ok = st.fail("%s: indices have too many dims", op);
  const int64_t n = ok ? weight.size(0) : 0, d = ok ? weight.size(1) * (8 / bits) : 0;
  int64_t groups = 0;
  ok = ok && table_of(op, "weight_scales", scales, n, groups, e.scales, st) &&
      (!has_zp || table_of(op, "weight_zero_points", *zps, n, groups, e.zero_points, st));
  if (ok && (groups < 1 || d % groups != 0)) {
    ok = st.fail("%s: %lld scale groups do not divide D = %lld columns", op, (long long)groups, (long long)d);
  }
  // Packed rows are read byte by byte: a table whose bytes are not contiguous is copied once.
  Layout lw;
  ok = ok && layout_of(weight, "weight", lw, st);
  Input w(weight, lw);
  if (ok && bits < 8 && lw.sizes[1] > 1 && lw.strides[1] != 1) w.make_contiguous();
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
    const int64_t bad = emb::bad_index(idx.data(), static_cast<int64_t>(idx.size()), n);
    if (bad >= 0) ok = st.fail("%s: index %lld is out of range for %lld rows", op, (long long)idx[bad], (long long)n);
  }
  Out o(out);
  if (ok) {
    int64_t sizes[etfuse::core::kMaxDims];
    for (int k = 0; k < lidx.ndim; ++k) sizes[k] = lidx.sizes[k];
    sizes[lidx.ndim] = d;
    ok = o.resize(op, lidx.ndim + 1, sizes, st) &&
        o.open({&weight, &scales, has_zp ? &*zps : nullptr, &indices}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  e.weight = w.data<uint8_t>();
  e.rows = n;
  e.dim = d;
  e.w_stride0 = w.layout().strides[0];
  e.w_stride1 = w.layout().strides[1];
  e.groups = groups;
  e.indices = idx.data();
  e.num_indices = static_cast<int64_t>(idx.size());
  e.out = o.raw();
  emb::embedding(e, Parallel{});
  return o.finish();
}

#define ETFUSE_EMBEDDING(NAME, BITS)                                                                          \
  Tensor& NAME##_out(Context& ctx, const Tensor& weight, const Tensor& scales, const OptTensor& zps,          \
                     int64_t qmin, int64_t qmax, const Tensor& indices, Tensor& out) {                        \
    return embedding_impl(ctx, "quantized_decomposed::" #NAME ".out", BITS, weight, scales, zps, qmin, qmax, \
                          indices, std::nullopt, out);                                                        \
  }                                                                                                           \
  Tensor& NAME##_dtype_out(Context& ctx, const Tensor& weight, const Tensor& scales, const OptTensor& zps,    \
                           int64_t qmin, int64_t qmax, const Tensor& indices, std::optional<ScalarType> dtype, \
                           Tensor& out) {                                                                     \
    return embedding_impl(ctx, "quantized_decomposed::" #NAME ".dtype_out", BITS, weight, scales, zps, qmin,  \
                          qmax, indices, dtype, out);                                                         \
  }

ETFUSE_EMBEDDING(embedding_byte, 8)
ETFUSE_EMBEDDING(embedding_4bit, 4)
ETFUSE_EMBEDDING(embedding_2bit, 2)

#define ETFUSE_EMBEDDING_INT8_ZP(NAME, BITS)                                                                    \
  Tensor& NAME##_out(Context& ctx, const Tensor& weight, const Tensor& scales, const OptTensor& zps, int64_t qmin, \
                     int64_t qmax, const Tensor& indices, std::optional<ScalarType> dtype, Tensor& out) {          \
    return embedding_impl(ctx, "etfuse::" #NAME ".out", BITS, weight, scales, zps, qmin, qmax, indices, dtype, out, \
                          true);                                                                                    \
  }

ETFUSE_EMBEDDING_INT8_ZP(embedding_byte_int8_zp, 8)
ETFUSE_EMBEDDING_INT8_ZP(embedding_4bit_int8_zp, 4)
ETFUSE_EMBEDDING_INT8_ZP(embedding_2bit_int8_zp, 2)

}  // namespace

ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_byte.out", embedding_byte_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_byte.dtype_out", embedding_byte_dtype_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_4bit.out", embedding_4bit_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_4bit.dtype_out", embedding_4bit_dtype_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_2bit.out", embedding_2bit_out);
ETFUSE_REGISTER(etfuse, "quantized_decomposed_embedding_2bit.dtype_out", embedding_2bit_dtype_out);
ETFUSE_REGISTER(etfuse, "embedding_byte_int8_zp.out", embedding_byte_int8_zp_out);
ETFUSE_REGISTER(etfuse, "embedding_4bit_int8_zp.out", embedding_4bit_int8_zp_out);
ETFUSE_REGISTER(etfuse, "embedding_2bit_int8_zp.out", embedding_2bit_int8_zp_out);
