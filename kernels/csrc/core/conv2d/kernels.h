// conv2d's table of kernels per ISA (Kernels, kernels(Isa)): the direct, depthwise and
// phase-plane GEMM functions each ISA runs, or null for a path it does not take; run_paths
// and its predicates read it.
#pragma once

#include "core/conv2d/common.h"
#include "core/conv2d/depthwise_blocks.h"
#include "core/conv2d/depthwise_channels.h"
#include "core/conv2d/depthwise_flat.h"
#include "core/conv2d/depthwise_rows.h"
#include "core/conv2d/direct_planes.h"
#include "core/conv2d/phase_gemm_tiles.h"
#include "core/conv2d/phase_split.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

constexpr int64_t kDirectNeonRows = 8;  // Kernels::direct_rows on NEON

// conv2d's kernels on one ISA: the one place they are chosen. A null entry is a path that ISA
// does not take (run_paths goes on to the next).
struct Kernels {
  void (*direct)(const Problem&, int64_t, int64_t, const float*);
  void (*depthwise_flat)(const Problem&, int64_t, int64_t);
  void (*depthwise_channels)(const Problem&, int64_t, int64_t);
  int64_t channels_width;                                      // depthwise_channels' vector width
  void (*depthwise_rows)(const Problem&, int64_t, int64_t);    // NEON
  void (*depthwise_blocks)(const Problem&, int64_t, int64_t);  // AVX-512, NEON
#if ETFUSE_HAVE_X86_DISPATCH
  // run_phase_gemm's tile loop and phase split, its panel width and rows (AVX2 and up)
  void (*tap_panels)(const TapTask&, int64_t, int64_t) = nullptr;
  void (*split_rows)(const Problem&, const PhaseGeom&, int64_t, int64_t, float*, const PhaseRows&) = nullptr;
  int64_t tap_nr = 0, tap_mr = 0;
#endif
  // Spatial convs (groups 1) whose output rows are at least this wide take `direct` whatever
  // their channels (0: only is_direct's few-channel ones). NEON's 8-plane blocks are a GEMM
  // tile that reads B in place from the phase planes: no window packing. Measured on
  // neoverse-n1 (instructions per call, implicit GEMM -> direct): 32 -> 64 stride 2 on 64x64
  // 8.26 -> 7.19 M, 16 -> 64 on 55x55 12.4 -> 10.4, 32 -> 128 on 27x27 12.8 -> 10.3, 48 -> 192 on
  // 13x13 6.58 -> 6.32, 64 -> 64 on 24x24 9.28 -> 8.18, 128 -> 128 on 12x12 10.97 -> 9.49, a 7x7
  // stride-2 stem to 48x48 9.66 -> 8.30. With the 8-plane blocks in assembly (arm::DirectNeon::block8)
  // 8-wide rows win too, their dropped columns (2 of 10) included: 64 -> 64 on 8x8 1.27 -> 1.18,
  // 32 -> 64 stride 2 to 8x8 0.68 -> 0.60, 32 -> 128 on 11x11 2.58 -> 1.90 (rows under 8 are
  // not direct: kDirectMinWidth).
  int64_t direct_rows = 0;
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
      return {&direct_avx2, &depthwise_flat_avx2, &depthwise_channels_avx512, 16, nullptr, &depthwise_blocks_avx512,
              &tap_panels_avx512, &split_rows_avx512, kTapPanelAvx512, kTapRowsAvx512};
    case Isa::kAvx2:
      return {&direct_avx2, &depthwise_flat_avx2, &depthwise_channels_avx2, 8, nullptr, nullptr,
              &tap_panels_avx2, &split_rows_avx2, kTapPanelAvx2, kTapRowsAvx2};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon:
      return {&direct_neon, &depthwise_flat_baseline, &depthwise_channels_baseline, 4, &depthwise_rows_neon,
              &depthwise_blocks_neon, kDirectNeonRows};
#endif
    default:
      return {&direct_baseline, &depthwise_flat_baseline, &depthwise_channels_baseline, 4, nullptr, nullptr};
  }
}

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
