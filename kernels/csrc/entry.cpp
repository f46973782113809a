// Plain C entry points of each library (ctypes), compiled once per library with
// -DETFUSE_LIBRARY_PREFIX=etfuse_eager / etfuse_runtime:
// the ISA the dispatched loops use (per library), and the runtime's thread count.
#include "core/common.h"

#if defined(ETFUSE_RUNTIME)
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#endif

#define ETFUSE_CAT2(a, b) a##b
#define ETFUSE_CAT(a, b) ETFUSE_CAT2(a, b)
#define ETFUSE_ENTRY(name) ETFUSE_CAT(ETFUSE_LIBRARY_PREFIX, name)

ETFUSE_EXPORT const char* ETFUSE_ENTRY(_isa)() {
  return etfuse::core::current_isa_name();
}

ETFUSE_EXPORT int ETFUSE_ENTRY(_set_isa)(const char* name) {
  return etfuse::core::set_isa(name) ? 1 : 0;
}

#if defined(ETFUSE_RUNTIME)
ETFUSE_EXPORT int64_t ETFUSE_ENTRY(_thread_count)() {
  return static_cast<int64_t>(::executorch::extension::get_thread_count());
}
#endif
