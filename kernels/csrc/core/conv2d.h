// etfuse::conv2d_act.out core: out = clamp(conv2d(input, weight, bias), min, max), float32, NCHW.
//
// input [N, C, H, W], weight [Cout, C / groups, KH, KW], bias [Cout] or none; any stride,
// padding, dilation and groups; every operand read through its strides. The algorithms:
//
// * depthwise (groups == C, one input channel per group), few output channels per group or a
//   short K (is_direct: ResNet8's 16-channel 3x3s, a 3-channel stem): a direct kernel, one
//   output plane per task, by polyphase decomposition (direct_planes): every tap is one
//   contiguous multiply-add over the flattened plane, so any stride, dilation or map size
//   vectorises (on AVX2, only depthwise convs and maps under 4x4: the phase planes below win);
// * any other spatial kernel (3x3, 7x7, 1xk) from 4x4 outputs on (uses_phase_gemm): the GEMM over
//   the image's zero-padded phase planes, each row of B one plane shifted to its tap and read
//   in place (run_phase_gemm, tap_tile);
// * a small output map whose pixels fill the GEMM's panels badly (small_map): the transposed
//   problem on the GEMM's dot-product path, over the image's im2col;
// * a weight packed at fuse time (conv2d_packed_act, run_packed): the transposed problem on the
//   GEMM's tiles, the packed weight read in place;
// * everything else: the shared GEMM per (image, group) with M = output channels, N = output
//   pixels, K = C / groups * KH * KW. No im2col buffer: the GEMM's B panels are packed straight
//   from the input windows (implicit GEMM, `gemm::Args::pack`), zeros for the padding; bias and
//   clamp run in the GEMM epilogue while the tile is in registers.
//
// One header per algorithm in core/conv2d/ (common.h: the problem and the shared helpers;
// kernels.h: the table of kernels per ISA); here the predicates that choose, run_paths (the one
// chooser) and run.
#pragma once

#include <vector>

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/depthwise_neon.h"
#endif

// In the order the one header defined them: GCC's inlining follows the definition order, and
// this order compiles to the same code.
#include "core/conv2d/implicit_gemm.h"
#include "core/conv2d/phase_split.h"
#include "core/conv2d/direct_planes.h"
#include "core/conv2d/depthwise_channels.h"
#include "core/conv2d/depthwise_blocks.h"
#include "core/conv2d/depthwise_flat.h"
#include "core/conv2d/depthwise_rows.h"
#include "core/conv2d/phase_gemm_tiles.h"
#include "core/conv2d/kernels.h"
#include "core/conv2d/phase_gemm.h"
#include "core/conv2d/small_map.h"
#include "core/conv2d/packed.h"
#include "core/conv2d/residual.h"

namespace etfuse {
namespace core {
namespace conv2d {

inline bool is_depthwise(const Problem& pb) {
  return pb.p.groups > 1 && pb.p.groups == pb.li.sizes[1] && pb.lw.sizes[1] == 1;
}

// Depthwise convs (multiplier 1) with at most this many output pixels run W channels at a time
// (detail::depthwise_channels) instead of plane by plane. Measured on the runtime (AVX2, 2
// threads, us, planes -> channels): 576 channels 3x3 stride 2 on 6x6 73 -> 24, 960 on 3x3 43 ->
// 30, 384 on 6x6 33 -> 24, 672 5x5 on 6x6 95 -> 50, 192 stride 2 on 12x12 51 -> 20; at 12x12
// outputs the interleaving costs more than the plane setup (192 on 12x12: 31 -> 38).
// With AVX-512 it runs 16 channels a vector (partial blocks by masked moves), for the planes that
// depthwise_blocks_avx512 (below) does not take: flat planes go there first.
constexpr int64_t kChannelsMaxPixels = 64;

// The direct kernel (detail::direct_planes) instead of the implicit GEMM where packing the
// GEMM's B panels (the input windows: K floats per output pixel, whatever the output channels)
// costs about as much as the multiply-adds (M * K per output pixel): few output channels per
// group, or a short K (a 3-channel 3x3 stem has K = 27). Measured on AVX2 (us, GEMM -> direct):
// ResNet8's 16 -> 16 3x3 on 32x32 156 -> 75, 32 -> 32 on 16x16 97 -> 77, MobileNetV2's stem
// 173 -> 96, SqueezeNet's 191 -> 145; with 64 output channels the GEMM wins (64 -> 64 3x3 on
// 8x8: 76 vs 112), and for 1x1 convs, whose B panels are copies of the input, the GEMM wins
// (MobileNetV2's 144 -> 24 on 24x24: 51 vs 130).
constexpr int64_t kDirectMaxOutputs = 32, kDirectMaxK = 576, kDirectShortK = 64;
// direct_planes computes whole phase rows, vectors along them: on rows narrower than an AVX2
// vector the dropped columns and the per-block setup outweigh the multiply-adds, and the
// implicit GEMM wins (DS-CNN's 1 -> 64 10x4 stem, 25x5 output: 34 -> 28 us per call, XNNPACK 25).
constexpr int64_t kDirectMinWidth = 8;

// A spatial conv that is not depthwise runs as the GEMM on its phase planes
// (detail::run_phase_gemm) from this many output pixels on (AVX2 and up; the SSE2 baseline
// keeps the paths below). Measured on one AVX-512 thread (us, old path -> phase planes):
// ResNet-18's 64 -> 64 on 24x24 463 -> 308 (implicit GEMM), 128 -> 128 on 12x12 536 -> 317,
// ResNet8's 16 -> 16 on 32x32 67 -> 43 (direct), a 7x7 stride-2 stem 573 -> 305, 256 -> 256 on
// 6x6 941 -> 531 (small map), 96 -> 96 on 4x4 55 -> 52; on 3x3 maps the small-map path wins
// (512 -> 512: 1067 vs 1144; 64 -> 64: 17 vs 25). AVX2 alone: 64 -> 64 on 24x24 647 -> 415,
// 16 -> 16 on 32x32 68 -> 65.
constexpr int64_t kPhaseMinPixels = 16;

inline bool uses_phase_gemm(const Problem& pb) {
#if ETFUSE_HAVE_X86_DISPATCH
  return !pb.packed && !pb.packed_i8 && !is_depthwise(pb) && pb.lw.sizes[2] * pb.lw.sizes[3] > 1 &&
      pb.lo.sizes[2] * pb.lo.sizes[3] >= kPhaseMinPixels && detail::kernels(selected_isa()).tap_panels;
#else
  (void)pb;
  return false;
#endif
}

inline bool is_direct(const Problem& pb) {
  if (!is_depthwise(pb) && pb.lo.sizes[3] < kDirectMinWidth) return false;
  const int64_t Mg = pb.lo.sizes[1] / pb.p.groups;
  const int64_t K = pb.li.sizes[1] / pb.p.groups * pb.lw.sizes[2] * pb.lw.sizes[3];
  const bool spatial = pb.lw.sizes[2] * pb.lw.sizes[3] > 1;  // a 1x1 packs by memcpy (pack_windows)
  const int64_t rows = detail::kernels(selected_isa()).direct_rows;
  if (spatial && pb.p.groups == 1 && rows > 0 && pb.lo.sizes[3] >= rows) return true;
  return is_depthwise(pb) || (spatial && (K <= kDirectShortK || (Mg <= kDirectMaxOutputs && K <= kDirectMaxK)));
}

// Depthwise convs (multiplier 1, stride 1, output rows as wide as the input's) with at most this
// many output pixels run on flattened planes (detail::depthwise_flat). Measured on the runtime
// (AVX2, 2 threads, us per layer over 8 layers, before -> flat; XNNPACK): 64 channels on 25x5
// 29 -> 11 (8); 64 on 12x12 20 -> 13 (8); 128 on 6x6 17 -> 10 (5); 256 on 3x3 14 -> 12 (5);
// 128 5x5 on 6x6 14 -> 13 (9). At 24x24 it is even or worse (96 channels: 38 -> 49), at 48x48
// worse (16 channels: 28 -> 35): the per-plane row copies it saves matter less there than the
// masked column sums it adds.
constexpr int64_t kFlatMaxPixels = 256;

inline bool use_flat_depthwise(const Problem& pb) {
  const Params& p = pb.p;
  return is_depthwise(pb) && pb.lo.sizes[1] == p.groups && p.stride[0] == 1 && p.stride[1] == 1 &&
      2 * p.padding[1] == (pb.lw.sizes[3] - 1) * p.dilation[1] && pb.lo.sizes[2] * pb.lo.sizes[3] <= kFlatMaxPixels;
}

// Depthwise convs (multiplier 1) with flat planes in and out and at most this many output
// pixels run 16 channels a vector on AVX-512 (detail::depthwise_blocks_avx512), ahead of the
// paths above.
constexpr int64_t kBlocksMaxPixels = 576;

// Depthwise convs (multiplier 1) that detail::depthwise_rows takes on NEON: a square 3x3 or 5x5
// kernel, stride 1 or 2 along both dims, no dilation, output rows at least 4 wide.
inline bool uses_depthwise_rows(const Problem& pb) {
#if ETFUSE_HAVE_ARM_NEON
  const Params& p = pb.p;
  return detail::kernels(selected_isa()).depthwise_rows && is_depthwise(pb) && pb.lo.sizes[1] == p.groups &&
      pb.lw.sizes[2] == pb.lw.sizes[3] && p.stride[0] == p.stride[1] && p.dilation[0] == 1 && p.dilation[1] == 1 &&
      pb.lo.sizes[3] >= 4 && arm::DepthwiseNeon::supports(pb.lw.sizes[2], p.stride[0]);
#else
  (void)pb;
  return false;
#endif
}

// On NEON (detail::depthwise_blocks_neon, 4 channels a vector) up to this many output pixels,
// ahead of the rows kernel. Measured on neoverse-n1 (instructions per call, rows -> blocks):
// 64 channels on 25x5 180 -> 82 K, 128 on 6x6 101 -> 56, 256 on 3x3 134 -> 63, 128 on 12x12
// 236 -> 138, 96 on 24x24 506 -> 347, 32 on 48x48 512 -> 434, 64 stride 2 to 12x12 165 -> 99,
// 120 5x5 on 12x12 356 -> 247, 16 stride 2 to 48x48 527 -> 332.
constexpr int64_t kBlocksNeonMaxPixels = 48 * 48;

inline bool uses_depthwise_blocks(const Problem& pb) {
#if ETFUSE_HAVE_X86_DISPATCH
  return detail::kernels(selected_isa()).depthwise_blocks && is_depthwise(pb) && pb.lo.sizes[1] == pb.p.groups &&
      pb.lo.sizes[2] * pb.lo.sizes[3] <= kBlocksMaxPixels && pb.li.strides[3] == 1 &&
      pb.li.strides[2] == pb.li.sizes[3] && pb.lo.strides[3] == 1 && pb.lo.strides[2] == pb.lo.sizes[3];
#elif ETFUSE_HAVE_ARM_NEON
  const Params& p = pb.p;
  return detail::kernels(selected_isa()).depthwise_blocks && is_depthwise(pb) && pb.lo.sizes[1] == p.groups &&
      pb.lo.sizes[2] * pb.lo.sizes[3] <= kBlocksNeonMaxPixels && pb.lw.sizes[2] == pb.lw.sizes[3] &&
      p.stride[0] == p.stride[1] && p.dilation[0] == 1 && p.dilation[1] == 1 && pb.li.strides[3] == 1 &&
      pb.lo.strides[3] == 1 && arm::ChannelsNeon::supports(pb.lw.sizes[2], p.stride[0]);
#else
  (void)pb;
  return false;
#endif
}

// Whether run_paths' path adds Problem::residual in its epilogue: the GEMM's (gemm::Args::residual)
// and the phase planes' (tap_tile) do; the direct and depthwise kernels (every depthwise conv is
// is_direct) do not, and `run` adds it after them (detail::add_residual).
inline bool adds_residual(const Problem& pb) {
  return pb.packed || pb.packed_i8 || uses_phase_gemm(pb) || !is_direct(pb);
}

// Fills the problem; `out` must already have the shape from out_shape.
inline bool make_problem(
    const float* in, const Layout& li, const float* w, const Layout& lw, const float* bias, const Layout* lb,
    float* out, const Layout& lo, const Params& p, Problem& pb, Status& st) {
  if (lo.ndim != 4) return st.fail("etfuse::conv2d_act.out: out must be 4-D, got %s", ShapeStr(lo).c_str());
  pb.in = in;
  pb.li = li;
  pb.w = w;
  pb.lw = lw;
  pb.bias = bias;
  pb.bias_s = bias ? lb->strides[0] : 0;
  pb.out = out;
  pb.lo = lo;
  pb.p = p;
  return true;
}

// The GEMM path needs A (the weight of one group) as a [Cout/G, K] matrix with unit stride
// along K: true for contiguous weights. Otherwise the caller passes a contiguous copy.
inline bool weight_is_matrix(const Layout& lw) {
  return lw.strides[3] == 1 && lw.strides[2] == lw.sizes[3] && lw.strides[1] == lw.sizes[2] * lw.sizes[3];
}

template <class Par>
inline void run_paths(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  if (pb.packed || pb.packed_i8) {
    detail::run_packed(pb, par);
    return;
  }
#if ETFUSE_HAVE_X86_DISPATCH || ETFUSE_HAVE_ARM_NEON
  if (uses_depthwise_blocks(pb)) {
    constexpr int64_t bw = ETFUSE_HAVE_ARM_NEON ? 4 : 16;  // channels a block: NEON's vector, AVX-512's
    const int64_t blocks = N * ((Cout + bw - 1) / bw);
    // per block: a tap is one FMA for bw channels, the transposes and stores about 16 an output
    // and 8 an input, all about 4 times the GEMM's cost per multiply-add
    const int64_t per_block = bw * 4 * (OH * OW * (pb.lw.sizes[2] * pb.lw.sizes[3] + 16) + 8 * pb.li.sizes[2] * pb.li.sizes[3]);
    SerialBelow<Par&>{par, blocks * per_block < kParallelMinMacs}(
        int64_t(0), blocks, 1, [&](int64_t b, int64_t e) { detail::kernels(selected_isa()).depthwise_blocks(pb, b, e); });
    return;
  }
#endif
#if ETFUSE_HAVE_ARM_NEON
  if (uses_depthwise_rows(pb)) {
    detail::serial_or_parallel(N * Cout, detail::grain_for(int64_t(1) << 15, OH * OW * pb.lw.sizes[2] * pb.lw.sizes[3]),
                               par, [&](int64_t b, int64_t e) { detail::kernels(selected_isa()).depthwise_rows(pb, b, e); });
    return;
  }
#endif
  if (use_flat_depthwise(pb)) {
    const auto fn = detail::kernels(selected_isa()).depthwise_flat;
    detail::serial_or_parallel(N * Cout, detail::grain_for(int64_t(1) << 15, OH * OW * pb.lw.sizes[2] * pb.lw.sizes[3]),
                               par, [&](int64_t b, int64_t e) { fn(pb, b, e); });
    return;
  }
  if (is_depthwise(pb) && Cout == p.groups && OH * OW <= kChannelsMaxPixels) {
    const detail::Kernels kern = detail::kernels(selected_isa());
    const int64_t W = kern.channels_width, blocks = N * ((Cout + W - 1) / W);
    const auto fn = kern.depthwise_channels;
    detail::serial_or_parallel(blocks, detail::grain_for(int64_t(1) << 15, W * OH * OW * pb.lw.sizes[2] * pb.lw.sizes[3]),
                               par, [&](int64_t b, int64_t e) { fn(pb, b, e); });
    return;
  }
#if ETFUSE_HAVE_X86_DISPATCH
  if (uses_phase_gemm(pb)) {
    detail::run_phase_gemm(pb, par);
    return;
  }
#endif
  if (is_direct(pb)) {
    int64_t grain = detail::grain_for(int64_t(1) << 16, OH * OW * pb.lw.sizes[1] * pb.lw.sizes[2] * pb.lw.sizes[3]);
    const auto fn = detail::kernels(selected_isa()).direct;
    if (p.groups == 1 && Cout > 1) {
      // Every output plane reads all the input channels (a stem: 32 outputs from 3 inputs): they
      // are split into phase planes once per image, channel by channel in parallel, and shared
      // by the tasks. Split per task, the gather loops were the top of a perf profile of
      // MobileNetV1's 3 -> 8 stem on 96x96; shared, its multiply-adds are.
      const detail::PhaseGeom geom(pb);
      const int64_t C = pb.li.sizes[1];
      constexpr int64_t kSlack = detail::kDirectBlock * 8;  // direct_planes' over-read past the phases: U * W, W <= 8
      std::vector<float> split(static_cast<size_t>(C * geom.channel + kSlack), 0.0f);
      for (int64_t n = 0; n < N; ++n) {
        // one channel per task, in parallel only when the copy is worth a dispatch
        detail::serial_or_parallel(C, C * geom.channel <= kSerialElements / 4 ? C : 1, par, [&](int64_t c0, int64_t c1) {
          detail::split_phases(pb, geom, n, 0, c0, c1, split.data());
        });
        detail::serial_or_parallel(Cout, grain, par, [&](int64_t b, int64_t e) {
          fn(pb, n * Cout + b, n * Cout + e, split.data());
        });
      }
      return;
    }
    const int64_t planes = N * Cout;
    // Every task splits its groups' input planes afresh: where output planes share them, at
    // most 4 tasks.
    const int64_t mult = Cout / p.groups;
    if (mult > 1 && grain < (planes + 3) / 4) grain = (planes + 3) / 4;
    detail::serial_or_parallel(planes, grain, par, [&](int64_t b, int64_t e) { fn(pb, b, e, nullptr); });
    return;
  }
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  if (detail::small_map(OH * OW, Cg * KH * KW)) {
    detail::run_small_map(pb, par);
    return;
  }
  detail::run_implicit_gemm(pb, par);
}

// The phase-plane GEMM's tasks each split the input they read (run_phase_gemm), so a split op
// moves no more data between the cores than the op after it would anyway. Measured on ResNet8
// (3 -> 16 stem on 32x32, 0.44 M multiply-adds: 13.6 us on one thread, 12.3 split; the forward on
// 2 threads, us, eight runs each alternated: 191-211, median 203, before; 193-215, median 198).
// Below 384 K the split loses: DS-CNN's 1 -> 64 10x4 stem (work 361 K) on one thread leaves its
// output in the caller's cache for the serial depthwise conv after it, which read half of it out
// of the other core's (6.2 us against 4.2 for the other three): the forward 63.9 -> 60.7 us
// (medians of 7 alternated runs), while ResNet8's stem (449 K) kept on two threads 183 vs 188.
constexpr int64_t kPhaseParallelMinMacs = int64_t(3) << 17;

// The conv (every path above), on the calling thread alone when it is small (kParallelMinMacs).
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  if (N == 0 || Cout == 0 || OH == 0 || OW == 0) return;
  // the work in GEMM multiply-adds (kParallelMinMacs): a depthwise one costs about 4 (no reuse
  // across output channels), and on a small map every input element about 64 more (each is
  // interleaved channels-wise and back: depthwise_channels; MobileNetV2's 384 channels on 6x6,
  // 0.12 M multiply-adds, took 15.6 us on one thread, 11.2 on two)
  const bool dw = is_depthwise(pb);
  const int64_t weights = Cout * (pb.li.sizes[1] / pb.p.groups) * pb.lw.sizes[2] * pb.lw.sizes[3];
  const int64_t inputs = N * pb.li.sizes[1] * pb.li.sizes[2] * pb.li.sizes[3];
  const int64_t work = N * OH * OW * weights * (dw ? 4 : 1) + kMacsPerElement * weights +
      (dw && OH * OW <= kChannelsMaxPixels ? 64 * inputs : 0);
  const bool serial = work < (uses_phase_gemm(pb) ? kPhaseParallelMinMacs : kParallelMinMacs);
  if (pb.residual && !adds_residual(pb)) {
    Problem sums = pb;  // the conv alone, then the residual and the clamp
    sums.residual = nullptr;
    sums.p.has_min = sums.p.has_max = false;
    run_paths(sums, SerialBelow<Par>{par, serial});
    detail::add_residual(pb);
    return;
  }
  run_paths(pb, SerialBelow<Par>{par, serial});
}

// The GEMM path writes output pixel j = oh * OW + ow at j * stride(3): the output plane must
// be "flat" (stride(2) == OW * stride(3)). The direct kernel handles any output strides.
inline bool out_is_flat(const Problem& pb) {
  return (!pb.packed && !pb.packed_i8 && !uses_phase_gemm(pb) && is_direct(pb)) || pb.lo.sizes[2] <= 1 || pb.lo.strides[2] == pb.lo.sizes[3] * pb.lo.strides[3];
}

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
