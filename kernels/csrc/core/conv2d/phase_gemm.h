// A spatial conv that is not depthwise as the GEMM over the image's phase planes
// (run_phase_gemm): tasks that each split the rows they read, then run their tiles. run_paths
// takes it on AVX2 and up from kPhaseMinPixels outputs (uses_phase_gemm).
#pragma once

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/conv2d/common.h"
#include "core/conv2d/kernels.h"
#include "core/conv2d/phase_gemm_tiles.h"
#include "core/conv2d/phase_split.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

#if ETFUSE_HAVE_X86_DISPATCH

// A phase-plane GEMM task's input: the phase rows it reads, split by its own thread into this
// buffer. `call` names the (call, image, group) whose whole planes it holds (a channel block's
// task; 0: none), so a thread's second task of the same call does not split them again.
struct PhaseBuffer {
  std::vector<float> data;
  std::vector<const float*> tap;
  uint64_t call = 0;
};

// Below this many column panels the tasks are blocks of output channels over the whole map,
// from it bands of output rows. Bands compute more dropped columns (a band's last panel) and
// each task splits only its rows; blocks split the whole map, once per thread. Measured on
// ResNet8 on the runtime, 2 threads (us a forward, three runs): bands from 16 panels (its 16x16
// maps have 9) 217 226 216, bands everywhere 212 244 229, blocks everywhere 220 217 193. Maps
// from 64 panels (ResNet-18's 56x56 at 224) take bands: a thread's rows stay in its L2.
constexpr int64_t kPhaseBandPanels = 64;

// Runs the whole phase-plane GEMM, image by image and group by group, as parallel tasks that
// each split the input rows they read (with the padding) into their own thread's buffer, then
// run their panels: a band of output rows with every output channel or, on a map of few
// panels, a block of output channels with every row. Split once by the calling thread, the
// other thread's panels read every phase line out of the caller's cache, a miss in the middle
// of the multiply-adds: ResNet8's 16 -> 16 on 32x32 took 33 us on one thread and 41 on two.
// Bands also keep a thread on the rows it wrote in the op before (the pool deals its chunks
// out in order, the first ones to the calling thread).
template <class Par>
inline void run_phase_gemm(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], OH = pb.lo.sizes[2];
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = pb.lo.sizes[1] / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = Cg * KH * KW;
  const PhaseGeom geom(pb);
  const Kernels kern = kernels(selected_isa());
  const int64_t NR = kern.tap_nr, MR = kern.tap_mr;
  const int64_t panels = (OH * geom.SW + NR - 1) / NR, tiles = (Mg + MR - 1) / MR;
  const bool by_rows = panels >= kPhaseBandPanels || tiles < 2;
  const int64_t phases = p.stride[0] * p.stride[1];
  // About 256 KFLOP per parallel chunk, as gemm::run
  const int64_t flop = int64_t(1) << 18, per_row = 2 * Mg * K * geom.SW, per_tile = 2 * MR * K * OH * geom.SW;
  const int64_t grain = std::max<int64_t>(1, flop / (by_rows ? per_row : per_tile));
  const auto fn = kern.tap_panels;
  const auto split = kern.split_rows;
  static std::atomic<uint64_t> calls{0};
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
      const float* w = pb.w + g * Mg * pb.lw.strides[0];
      // output rows [oh0, oh1), output channels [m0, m1) of the group
      const auto task = [&](int64_t oh0, int64_t oh1, int64_t m0, int64_t m1) {
        thread_local PhaseBuffer buf;
        const int64_t rows = oh1 - oh0 + geom.reach, plane = rows * geom.SW, channel = phases * plane;
        if (by_rows || buf.call != call) {
          const size_t size = static_cast<size_t>(Cg * channel + NR + geom.SW);  // the last panel reads past
          if (buf.data.size() < size) buf.data.resize(size);
          split(pb, geom, n, g, buf.data.data(), PhaseRows{oh0, oh0 + rows, plane, channel, true});
          std::fill(buf.data.data() + Cg * channel, buf.data.data() + size, 0.0f);
          buf.tap.resize(static_cast<size_t>(K));
          geom.taps(pb, buf.data.data(), buf.tap.data(), plane, channel);
          buf.call = by_rows ? 0 : call;
        }
        const int64_t Q = (oh1 - oh0) * geom.SW;
        const TapTask t{&pb, buf.tap.data(), w + m0 * pb.lw.strides[0], pb.lw.strides[0], K, m1 - m0, g * Mg + m0, n, geom.SW, Q, oh0};
        fn(t, 0, (Q + NR - 1) / NR);
      };
      if (by_rows) {
        serial_or_parallel(OH, grain, par, [&](int64_t b, int64_t e) { task(b, e, 0, Mg); });
      } else {
        serial_or_parallel(tiles, grain, par, [&](int64_t b, int64_t e) { task(0, OH, b * MR, std::min(e * MR, Mg)); });
      }
    }
  }
}
#endif  // ETFUSE_HAVE_X86_DISPATCH

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
