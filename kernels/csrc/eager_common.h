// Helpers shared by the torch eager registration files (eager_ops.cpp, conv_eager.cpp,
// quantized_eager.cpp), all linked into libetfuse_eager.so.
//
// `inline` functions in a named namespace: one definition for the whole library (no ODR
// clash between the translation units), and hidden like the rest (-fvisibility=hidden,
// -fvisibility-inlines-hidden). Each file pulls in what it uses with using-declarations.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "core/common.h"

namespace etfuse {
namespace eager {

// The cores' parallel_for: at::parallel_for (parallel only with -fopenmp).
struct AtenParallel {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    at::parallel_for(begin, end, grain, fn);
  }
};

inline core::Layout layout_of(const at::Tensor& t, const char* what) {
  core::Layout l;
  core::Status st;
  TORCH_CHECK(core::make_layout(l, t.dim(), t.sizes().data(), t.strides().data(), what, st), st.msg);
  return l;
}

inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(
      t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type(),
      " (etfuse kernels support float32 only)");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
}

inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() > 0 && b.numel() > 0 && at::get_overlap_status(a, b) != at::MemOverlapStatus::No;
}

}  // namespace eager
}  // namespace etfuse
