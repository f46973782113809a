// The benchmark-only library (libetfuse_probe.so, built on demand by benchmarks through
// etfuse.kernels.build.probe_library(); never part of the production libraries): the
// memory-bandwidth probe, run on the ExecuTorch threadpool with the same split as add_relu.
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/probe.h"

namespace {

struct EtParallel {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    (void)executorch::extension::parallel_for(begin, end, grain, fn);
  }
};

}  // namespace

// Median seconds of `reps` runs of c = a + b over n floats.
ETFUSE_EXPORT double etfuse_probe_stream_add(const float* a, const float* b, float* c, int64_t n, int64_t reps) {
  if (reps < 1) reps = 1;
  std::vector<double> times(static_cast<size_t>(reps));
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    etfuse::core::probe::stream_add(a, b, c, n, EtParallel{});
    const auto t1 = std::chrono::steady_clock::now();
    times[static_cast<size_t>(r)] = std::chrono::duration<double>(t1 - t0).count();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
