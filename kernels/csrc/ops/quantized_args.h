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

}  // namespace adapter
}  // namespace etfuse
