// Memory-bandwidth probe: a STREAM "add" loop (c = a + b: 2 reads + 1 write per element), split
// and dispatched exactly like add_relu's contiguous path, so the benchmark can tell how close
// the fused kernel gets to what the machine can move.
#pragma once

#include "core/common.h"

namespace etfuse {
namespace core {
namespace probe {
namespace detail {

ETFUSE_ALWAYS_INLINE void stream_add_impl(const float* a, const float* b, float* c, int64_t e0, int64_t e1) {
  for (int64_t i = e0; i < e1; ++i) c[i] = a[i] + b[i];
}
inline void stream_add_baseline(const float* a, const float* b, float* c, int64_t e0, int64_t e1) {
  stream_add_impl(a, b, c, e0, e1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 inline void stream_add_avx2(const float* a, const float* b, float* c, int64_t e0, int64_t e1) {
  stream_add_impl(a, b, c, e0, e1);
}
#endif

// The probe's loop on one ISA, chosen as elementwise.h chooses add_relu's.
struct Kernels {
  void (*stream_add)(const float*, const float*, float*, int64_t, int64_t);
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&stream_add_avx2};
#endif
    default: return {&stream_add_baseline};
  }
}

}  // namespace detail

template <class Par>
inline void stream_add(const float* a, const float* b, float* c, int64_t n, Par&& par) {
  const auto fn = detail::kernels(selected_isa()).stream_add;
  for_elements(n, par, [&](int64_t begin, int64_t end) { fn(a, b, c, begin, end); });
}

}  // namespace probe
}  // namespace core
}  // namespace etfuse
