// dtype and qparam arguments of the quantized_decomposed op files, read once for both builds.
#pragma once

#include "adapter.h"
#include "core/quantized.h"

namespace etfuse {
namespace adapter {

namespace qc = core::quantized;

inline bool qtype_of(const char* op, const char* name, ScalarType t, qc::QType& q, Status& st) {
  if (t == ScalarType::Char) {
    q = qc::QType::kInt8;
    return true;
  }
  if (t == ScalarType::Byte) {
    q = qc::QType::kUInt8;
    return true;
  }
  return st.fail("%s: %s must be int8 or uint8, got %s", op, name, dtype_name(t));
}

// Calls fn(T{}) with the C++ type of a quantized dtype (int8_t or uint8_t).
template <class F>
inline void with_qtype(qc::QType t, const F& fn) {
  if (t == qc::QType::kInt8) {
    fn(int8_t{});
  } else {
    fn(uint8_t{});
  }
}

// The per-tensor quantize / dequantize tail: dtype and qparams, `out` of input's shape, both
// read and written contiguously (through a copy / a temporary otherwise).
inline bool per_tensor_args(const char* op, const Tensor& input, ScalarType dtype, double scale, int64_t zp,
                            int64_t qmin, int64_t qmax, qc::QType& t, qc::QParams& p, Input& x, Out& o, Status& st) {
  Layout li;
  const bool ok = qtype_of(op, "dtype", dtype, t, st) && qc::make_qparams(op, "input", scale, zp, qmin, qmax, t, p, st) &&
      layout_of(input, "input", li, st) && o.resize(op, li.ndim, li.sizes, st) &&
      o.open({&input}, false, is_contiguous(o.layout()), st);
  if (ok) x.read(li, !is_contiguous(li));
  return ok;
}

}  // namespace adapter
}  // namespace etfuse
