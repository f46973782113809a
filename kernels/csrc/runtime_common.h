// Helpers shared by the ExecuTorch runtime registration files (runtime_ops.cpp and
// conv_runtime.cpp in libetfuse_runtime.so, quantized_runtime.cpp in
// libetfuse_quantized_runtime.so).
//
// `inline` functions in a named namespace: one definition per library (no ODR clash between
// the translation units), and hidden like the rest (-fvisibility=hidden,
// -fvisibility-inlines-hidden), so the RTLD_GLOBAL libraries export none of them. Each file
// pulls in what it uses with using-declarations.
#pragma once

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include "core/common.h"

namespace etfuse {
namespace runtime {

// The cores' parallel_for: the ExecuTorch threadpool.
struct EtParallel {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    // Only fails for invalid ranges, which the cores never pass.
    (void)executorch::extension::parallel_for(begin, end, grain, fn);
  }
};

inline bool layout_of(const executorch::aten::Tensor& t, const char* what, core::Layout& l, core::Status& st) {
  return core::make_layout(l, t.dim(), t.sizes().data(), t.strides().data(), what, st);
}

inline bool check_float(const char* op, const char* name, const executorch::aten::Tensor& t, core::Status& st) {
  if (t.scalar_type() == executorch::aten::ScalarType::Float) return true;
  return st.fail(
      "%s: %s must be float32, got %s (etfuse kernels support float32 only)", op, name,
      executorch::runtime::toString(t.scalar_type()));
}

// Resizes `out` to sizes[0:ndim] and reads back its layout (the float etfuse ops' message;
// quantized_runtime.cpp keeps its own).
inline bool resize_out(
    const char* op, executorch::aten::Tensor& out, int ndim, const int64_t* sizes, core::Layout& lo, core::Status& st) {
  const executorch::runtime::Error err =
      executorch::runtime::resize_tensor(out, executorch::aten::ArrayRef<int64_t>(sizes, ndim));
  if (err != executorch::runtime::Error::Ok) {
    core::Layout cur;
    core::Status ignore;
    layout_of(out, "out", cur, ignore);
    return st.fail(
        "%s: cannot resize out from %s to %s (static shape, rank change or above its upper bound)", op,
        core::ShapeStr(cur).c_str(), core::ShapeStr(sizes, ndim).c_str());
  }
  return layout_of(out, "out", lo, st);
}

}  // namespace runtime
}  // namespace etfuse
