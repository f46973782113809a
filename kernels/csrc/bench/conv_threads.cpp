// A standalone probe of one conv2d core call (no torch, no ExecuTorch): the conv on the calling
// thread vs split over 2 threads through the runtime's spinning pool, the same way
// adapter.h's `Parallel` cuts jobs. Built by hand, never by etfuse.kernels:
//
//   g++ -O3 -DNDEBUG -w -I kernels/csrc kernels/csrc/bench/conv_threads.cpp -o /tmp/conv_threads -lpthread
//   /tmp/conv_threads C Cout H W KH stride [KW PH PW]     (env: REPS, MODE=0 serial only / 1 split only, ISA, CONV_GROUPS,
//                                                           PACKED=1 the fuse-time packed weight)
//
// e.g. ResNet8's 16 -> 16 3x3 on 32x32: `/tmp/conv_threads 16 16 32 32 3 1`; DS-CNN's stem:
// `/tmp/conv_threads 1 64 49 10 10 2 4 5 1`. The numbers in docs/performance.md's phase-plane GEMM
// and threading notes came from it (with `perf record` on top).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/kernels.cpp"
#include "spin_pool.h"

using namespace etfuse::core;

// adapter.h's Parallel with 2 threads
struct TwoThreads {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    const int threads = 2;
    const int64_t n = end - begin, per = (n + 2 * threads - 1) / (2 * threads);
    int64_t chunk = balanced_grain(n, grain);
    if (chunk < per) chunk = balanced_grain(n, per);
    int64_t chunks = (n + chunk - 1) / chunk;
    if (chunks > 1 && chunks % threads) chunks = std::min(n, (chunks + threads - 1) / threads * threads);
    etfuse::pool::instance().run(begin, end, chunks, threads, &call<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }
  template <class F>
  static void call(void* fn, int64_t b, int64_t e) {
    (*static_cast<const F*>(fn))(b, e);
  }
};

struct OneThread {
  template <class F>
  void operator()(int64_t b, int64_t e, int64_t, const F& f) const {
    f(b, e);
  }
};

static Layout contiguous(std::vector<int64_t> sizes) {
  Layout l;
  l.ndim = static_cast<int>(sizes.size());
  for (int64_t i = l.ndim - 1, st = 1; i >= 0; --i) {
    l.sizes[i] = sizes[i];
    l.strides[i] = st;
    st *= sizes[i];
  }
  return l;
}

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s C Cout H W KH stride [KW PH PW]\n", argv[0]);
    return 2;
  }
  const int64_t C = atol(argv[1]), Co = atol(argv[2]), H = atol(argv[3]), W = atol(argv[4]), KH = atol(argv[5]),
                s = atol(argv[6]);
  const int64_t KW = argc > 7 ? atol(argv[7]) : KH, ph = argc > 8 ? atol(argv[8]) : KH / 2,
                pw = argc > 9 ? atol(argv[9]) : KW / 2;
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 2000;
  const int mode = getenv("MODE") ? atoi(getenv("MODE")) : -1;
  set_isa(getenv("ISA") ? getenv("ISA") : "auto");
  conv2d::Params p;
  p.stride[0] = p.stride[1] = s;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.groups = getenv("CONV_GROUPS") ? atol(getenv("CONV_GROUPS")) : 1;
  p.has_min = true;
  p.min = 0;
  const int64_t OH = (H + 2 * ph - KH) / s + 1, OW = (W + 2 * pw - KW) / s + 1;
  std::vector<float> in(C * H * W), w(Co * C / p.groups * KH * KW), out(Co * OH * OW), bias(Co);
  for (auto& v : in) v = (rand() % 2001 - 1000) / 1000.0f;
  for (auto& v : w) v = (rand() % 2001 - 1000) / 10000.0f;
  conv2d::Problem pb;
  Status st;
  const Layout lb = contiguous({Co});
  if (!conv2d::make_problem(in.data(), contiguous({1, C, H, W}), w.data(), contiguous({Co, C / p.groups, KH, KW}), bias.data(), &lb,
                            out.data(), contiguous({1, Co, OH, OW}), p, pb, st)) {
    std::fprintf(stderr, "%s\n", st.msg);
    return 1;
  }
  // PACKED=1: the weight packed as at fuse time (pack_gemm_weight: panels of gemm::kPanel output
  // channels, [K][kPanel] each), the path conv2d_packed_act takes
  std::vector<float> packed;
  if (getenv("PACKED") && atoi(getenv("PACKED"))) {
    const int64_t K = C / p.groups * KH * KW, P = gemm::kPanel, panels = gemm::packed_panels(Co);
    packed.assign(static_cast<size_t>(panels * K * P), 0.0f);
    for (int64_t co = 0; co < Co; ++co)
      for (int64_t k = 0; k < K; ++k) packed[(co / P) * K * P + k * P + co % P] = w[co * K + k];
    pb.packed = packed.data();
  }
  const double macs = double(Co) * OH * OW * C / p.groups * KH * KW;
  for (int split = 0; split < 2; ++split) {
    if (mode >= 0 && mode != split) continue;
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 100; ++i) split ? conv2d::run(pb, TwoThreads{}) : conv2d::run(pb, OneThread{});
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) split ? conv2d::run(pb, TwoThreads{}) : conv2d::run(pb, OneThread{});
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("%s %ld -> %ld on %ldx%ld, %ldx%ld stride %ld: %.2f us, %.1f multiply-adds/ns\n",
                  split ? "2 threads" : "1 thread ", C, Co, H, W, KH, KW, s, us, macs / us / 1e3);
    }
  }
  return 0;
}
