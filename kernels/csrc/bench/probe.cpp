// The benchmark- and test-only library (libetfuse_probe.so, built on demand through
// etfuse.kernels.build.probe_library(); never part of the production libraries):
//
// * the memory-bandwidth probe the kernels benchmark compares add_relu with, run on the
//   ExecuTorch threadpool with the same split as add_relu;
// * plain entries into the cores for their unit tests: the broadcast plan (checked against the
//   Triton launcher's Python twin) and the GEMM / conv2d epilogue with a per-output-channel
//   scale (no op uses it yet).
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/probe.h"
#include "core/broadcast.h"
#include "core/conv2d.h"
#include "core/gemm_entry.h"

namespace {

namespace core = etfuse::core;

struct EtParallel {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    (void)executorch::extension::parallel_for(begin, end, grain, fn);
  }
};

core::Layout contiguous(int ndim, const int64_t* sizes) {
  core::Layout l;
  l.ndim = ndim;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    l.sizes[d] = sizes[d];
    l.strides[d] = s;
    s *= sizes[d];
  }
  return l;
}

core::Layout strided(int ndim, const int64_t* sizes, const int64_t* strides) {
  core::Layout l;
  core::Status st;
  core::make_layout(l, ndim, sizes, strides, "t", st);
  return l;
}

}  // namespace

// Median seconds of `reps` runs of c = a + b over n floats.
ETFUSE_EXPORT double etfuse_probe_stream_add(const float* a, const float* b, float* c, int64_t n, int64_t reps) {
  if (reps < 1) reps = 1;
  std::vector<double> times(static_cast<size_t>(reps));
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    core::probe::stream_add(a, b, c, n, EtParallel{});
    const auto t1 = std::chrono::steady_clock::now();
    times[static_cast<size_t>(r)] = std::chrono::duration<double>(t1 - t0).count();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The broadcast plan (core/broadcast.h) of a contiguous out of out_sizes read from a and b:
// returns its number of dims n and writes sz/sa/sb/so[0:n], dim 0 innermost.
ETFUSE_EXPORT int etfuse_probe_broadcast_plan(int ndim, const int64_t* out_sizes, int a_ndim, const int64_t* a_sizes,
                                              const int64_t* a_strides, int b_ndim, const int64_t* b_sizes,
                                              const int64_t* b_strides, int64_t* sz, int64_t* sa, int64_t* sb,
                                              int64_t* so) {
  const core::broadcast::Plan p = core::broadcast::make_plan(
      strided(a_ndim, a_sizes, a_strides), strided(b_ndim, b_sizes, b_strides), contiguous(ndim, out_sizes));
  for (int d = 0; d < p.n; ++d) {
    sz[d] = p.sz[d];
    sa[d] = p.sa[d];
    sb[d] = p.sb[d];
    so[d] = p.so[d];
  }
  return p.n;
}

// C = clamp((A @ B) * scale[j] + bias[j], lo, hi) through the GEMM entry; A [M, K], B [K, N],
// C [M, N] contiguous; scale / bias [N] or null.
ETFUSE_EXPORT void etfuse_probe_gemm(int64_t M, int64_t N, int64_t K, const float* A, const float* B,
                                     const float* scale, const float* bias, float lo, float hi, float* C) {
  core::gemm::Args g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.a_rs = K;
  g.a_cs = 1;
  g.B = B;
  g.b_rs = N;
  g.b_cs = 1;
  g.C = C;
  g.c_rs = N;
  g.c_cs = 1;
  g.bias = bias;
  g.bias_cs = 1;
  g.scale = scale;
  g.scale_cs = 1;
  core::gemm_entry::run(g, core::gemm_entry::Clamp::between(true, lo, true, hi), EtParallel{});
}

// out = clamp(conv2d(input, weight) * scale[c] + bias[c], lo, hi), NCHW contiguous, square
// stride / padding, dilation 1; scale / bias [Cout] or null. Returns 0, or -1 on bad shapes.
ETFUSE_EXPORT int etfuse_probe_conv2d(const int64_t* in_sizes, const float* in, const int64_t* w_sizes, const float* w,
                                      const float* scale, const float* bias, int64_t stride, int64_t padding,
                                      int64_t groups, float lo, float hi, float* out) {
  core::conv2d::Params p;
  p.stride[0] = p.stride[1] = stride;
  p.padding[0] = p.padding[1] = padding;
  p.groups = groups;
  p.has_min = p.has_max = true;
  p.min = lo;
  p.max = hi;
  const core::Layout li = contiguous(4, in_sizes), lw = contiguous(4, w_sizes);
  core::Layout lb;
  lb.ndim = 1;
  lb.sizes[0] = w_sizes[0];
  lb.strides[0] = 1;
  core::Status st;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  if (!core::conv2d::out_shape(li, lw, bias ? &lb : nullptr, p, ndim, sizes, st)) return -1;
  core::conv2d::Problem pb;
  if (!core::conv2d::make_problem(in, li, w, lw, bias, bias ? &lb : nullptr, out, contiguous(4, sizes), p, pb, st)) {
    return -1;
  }
  pb.scale = scale;
  pb.scale_s = 1;
  core::conv2d::run(pb, EtParallel{});
  return 0;
}

// The ExecuTorch threadpool's wake-up, for spin_pool.h's numbers: `reps` regions of 2 chunks of
// `iters` dependent multiply-adds each, after `gap_us` of busy waiting on the calling thread;
// lag_us[r]: when the later of region r's two chunks started, from the region's start (about
// 0.8 us when a worker is spinning; its wake-up when the gap let it fall asleep).
ETFUSE_EXPORT void etfuse_probe_threadpool_lag(int64_t reps, int64_t iters, double gap_us, double* lag_us) {
  for (int64_t r = 0; r < reps; ++r) {
    const auto g0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - g0).count() < gap_us) {
    }
    const auto t0 = std::chrono::steady_clock::now();
    double start[2] = {0, 0};
    (void)executorch::extension::parallel_for(0, 2, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        start[c] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        volatile float x = 1.0f;
        float v = x;
        for (int64_t i = 0; i < iters; ++i) v = v * 0.999999f + 1e-7f;
        x = v;
      }
    });
    lag_us[r] = start[0] > start[1] ? start[0] : start[1];
  }
}
