// The direct conv by polyphase decomposition (direct_planes): one output plane per task, every
// tap one contiguous multiply-add over the flattened phase planes. run_paths takes it for
// depthwise convs, few output channels or a short K (is_direct), and on NEON for spatial convs
// with output rows at least Kernels::direct_rows wide.
#pragma once

#include <cstring>
#include <vector>

#include "core/conv2d/common.h"
#include "core/conv2d/phase_split.h"

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/depthwise_neon.h"
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// acc[q, q + U * W) = clamp(seed + sum_k wl[k] * tap[k][q, q + U * W), lo, hi): U independent
// sums kept in registers over all taps. Up to kDirectBlock = 8 of them: a multiply-add's
// latency is 4-5 cycles at two a cycle, so 4 chains kept the FMA units under half busy
// (MobileNetV1's 3 -> 8 stem on 96x96, one thread: 27.7 GFLOP/s with 4).
constexpr int kDirectBlock = 8;
template <int W, int U, int P>
ETFUSE_ALWAYS_INLINE void direct_block(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                          const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
  typedef typename gemm::detail::Vec<W>::type vf;
  vf r[P][U];
  for (int p = 0; p < P; ++p)
    for (int u = 0; u < U; ++u) r[p][u] = vf{} + seed[p];
  for (int64_t k = 0; k < taps; ++k) {
    const float* x = tap[k] + q;
    float wv[P];
    for (int p = 0; p < P; ++p) wv[p] = wl[p * taps + k];
    for (int u = 0; u < U; ++u) {
      vf v;
      std::memcpy(&v, x + u * W, sizeof(vf));
      for (int p = 0; p < P; ++p) r[p][u] += wv[p] * v;
    }
  }
  const vf vlo = vf{} + lo, vhi = vf{} + hi;
  for (int p = 0; p < P; ++p) {
    for (int u = 0; u < U; ++u) {
      // clamp_act lane by lane (NaN kept): v < lo ? lo : (v > hi ? hi : v)
      r[p][u] = r[p][u] < vlo ? vlo : (r[p][u] > vhi ? vhi : r[p][u]);
    }
    for (int u = 0; u < U; ++u) gemm::detail::store<W>(acc + p * acc_s + q + u * W, r[p][u]);
  }
}

// Output planes [t0, t1) of a direct conv (plane t = image t / Cout, channel t % Cout, summing
// over the Cg input channels of its group; Cg = 1 for a depthwise conv), by polyphase
// decomposition: each zero-padded input plane is split into sh * sw phase planes
// (phase (a, b) holds padded[i * sh + a][j * sw + b]), all SH x SW. Output (oh, ow) at tap
// (kh, kw) then reads phase ((kh * dh) % sh, (kw * dw) % sw) at (oh + kh * dh / sh, ow + kw * dw / sw):
// with q = oh * SW + ow, every tap is the same phase plane shifted by a constant, so the whole
// plane is one contiguous 1-D multiply-add per tap over q, whatever the stride, dilation or
// plane size. The positions ow >= OW of each row are computed and dropped (SW - OW of SW: 2 of
// 8 for a 6-wide 3x3 map). Small maps (6x6, 3x3), stride 2 and dilation all vectorise.
// The padding positions are the same for every plane: zeroed once, only the input is copied,
// once per group per task; or, with `split` (groups 1: a stem), the caller split the image's
// channels once for every task (split_phases; W * kDirectBlock zeros after them).
// Output planes summed together by direct_planes: aarch64's 32 vector registers hold 4 planes x 4
// vectors of sums (with 2, its stem spent 18 instructions per 8 multiply-adds, loading every
// input vector for two); x86's 16 hold 2 x 4.
constexpr int kDirectPlanes = ETFUSE_HAVE_ARM_NEON ? 4 : 2;

// direct_planes' blocks: direct_block, the weights laid out [plane][tap], up to kPlanes planes
// summed together. An ISA's own (e.g. arm::DirectNeon) may take them [tap][kPlanes]
// (kLaneWeights), and more planes.
struct PortableBlocks {
  static constexpr bool kLaneWeights = false;
  static constexpr int kPlanes = kDirectPlanes;
  template <int W, int U, int P>
  ETFUSE_ALWAYS_INLINE static void block(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                         const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
    direct_block<W, U, P>(q, seed, taps, tap, wl, lo, hi, acc, acc_s);
  }
};

// Blocks::block over `np` (2 .. P, P <= Blocks::kPlanes) planes
template <class Blocks, int W, int U, int P = Blocks::kPlanes>
ETFUSE_ALWAYS_INLINE void planes_block(int np, int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                       const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
  if constexpr (P > 2) {
    if (np == P) return Blocks::template block<W, U, P>(q, seed, taps, tap, wl, lo, hi, acc, acc_s);
    return planes_block<Blocks, W, U, P - 1>(np, q, seed, taps, tap, wl, lo, hi, acc, acc_s);
  }
  Blocks::template block<W, U, 2>(q, seed, taps, tap, wl, lo, hi, acc, acc_s);
}

template <int W, class Blocks = PortableBlocks>
ETFUSE_ALWAYS_INLINE void direct_planes(const Problem& pb, int64_t t0, int64_t t1, const float* split) {
  constexpr int U = kDirectBlock;  // the largest block of output vectors (direct_block)
  constexpr int kPlanes = Blocks::kPlanes;
  const Params& p = pb.p;
  const int64_t Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t mult = Cout / p.groups, Cg = pb.li.sizes[1] / p.groups;
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const PhaseGeom geom(pb);
  const int64_t SW = geom.SW, channel = geom.channel;
  const int64_t L = (OH - 1) * SW + OW;    // flat outputs q = oh * SW + ow, ow < OW kept
  const int64_t LP = (L + W - 1) / W * W;  // rounded up to whole vectors
  const int64_t taps = Cg * KH * KW;
  // The phase planes of the group's Cg channels, zero slack for the last block's over-read,
  // then the flat sums of up to kPlanes output planes.
  const int64_t own = split ? 0 : Cg * channel + W * U, acc_s = LP + W * U;
  std::vector<float> buf(static_cast<size_t>(own + kPlanes * acc_s), 0.0f);
  const float* phases = split ? split : buf.data();
  float* __restrict acc = buf.data() + own;
  std::vector<const float*> tap(static_cast<size_t>(taps));
  std::vector<float> wl(static_cast<size_t>(kPlanes * taps));
  // weight k of plane p at wl[wk_at(p, k)]
  const auto wk_at = [taps](int p, int64_t k) { return Blocks::kLaneWeights ? k * kPlanes + p : p * taps + k; };
  geom.taps(pb, phases, tap.data());
  const bool flat_w = pb.lw.strides[3] == 1 && pb.lw.strides[2] == KW && pb.lw.strides[1] == KH * KW;
  for (int64_t t = t0; t < t1;) {
    const int64_t n = t / Cout, co = t % Cout, group = co / mult;
    if (!split && (t == t0 || (t - 1) / mult != t / mult || mult == 1)) {  // a new group: split its input planes
      split_phases(pb, geom, n, group, 0, Cg, buf.data());
    }
    // Output planes that read the same phase planes (a stem's, or one group's) are summed
    // together: every input vector loaded then feeds np multiply-adds. One at a time, the
    // loads bound the loop (one a multiply-add, half of them across a cache line).
    int np = 1;
    while (np < kPlanes && t + np < t1 && co + np < Cout && (split || (co + np) / mult == group)) ++np;
    // The per-channel scale is folded into the weights, so clamp(conv * s + b) costs what
    // clamp(conv + b) does; the bias seeds the sums.
    float seed[kPlanes];
    for (int p = 0; p < np; ++p) {
      const float* wk = pb.w + (co + p) * pb.lw.strides[0];
      const float s = pb.scale ? pb.scale[(co + p) * pb.scale_s] : 1.0f;
      if (flat_w) {  // one loop GCC vectorises, not three with stride products
        for (int64_t k = 0; k < taps; ++k) wl[wk_at(p, k)] = wk[k] * s;
      } else {
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw)
              wl[wk_at(p, (c * KH + kh) * KW + kw)] =
                  wk[c * pb.lw.strides[1] + kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
      }
      seed[p] = pb.bias ? pb.bias[(co + p) * pb.bias_s] : 0.0f;
    }
    // Blocks of 8 vectors for one plane (4 for a depthwise 3x3: its short chains overlap block
    // to block, and the last block wastes less), of 4 for several planes; the last vectors as
    // one block of 2, 4 or 8 (over-reading into the slack), so no sum is a single latency-bound
    // chain of Cg * KH * KW multiply-adds.
    for (int64_t q = 0; q < LP;) {
      if constexpr (kPlanes > 4) {
        if (np > 4) {  // 5-8 planes (aarch64): 3 vectors of each, 24 sums in registers
          if (LP - q > 2 * W) {
            planes_block<Blocks, W, 3>(np, q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
            q += 3 * W;
          } else {
            planes_block<Blocks, W, 2>(np, q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
            q += 2 * W;
          }
          continue;
        }
      }
      if (np >= 2) {
        if (LP - q > 2 * W) {
          planes_block<Blocks, W, 4>(np, q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
          q += 4 * W;
        } else {
          planes_block<Blocks, W, 2>(np, q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
          q += 2 * W;
        }
      } else if (taps >= 16 && LP - q > 4 * W) {
        Blocks::template block<W, 8, 1>(q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
        q += 8 * W;
      } else if (LP - q > 2 * W) {
        Blocks::template block<W, 4, 1>(q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
        q += 4 * W;
      } else {
        Blocks::template block<W, 2, 1>(q, seed, taps, tap.data(), wl.data(), lo_v, hi_v, acc, acc_s);
        q += 2 * W;
      }
    }
    for (int p = 0; p < np; ++p) {
      float* oplane = pb.out + n * pb.lo.strides[0] + (co + p) * pb.lo.strides[1];
      const float* sums = acc + p * acc_s;
      const int64_t os = pb.lo.strides[3];
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* orow = oplane + oh * pb.lo.strides[2];
        if (os == 1) {
          copy_row<W>(orow, sums + oh * SW, OW);
        } else {
          for (int64_t i = 0; i < OW; ++i) orow[i * os] = sums[oh * SW + i];
        }
      }
    }
    t += np;
  }
}

// Compiled once per library in core/kernels.cpp.
void direct_baseline(const Problem& pb, int64_t t0, int64_t t1, const float* split);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void direct_avx2(const Problem& pb, int64_t t0, int64_t t1, const float* split);
#endif
#if ETFUSE_HAVE_ARM_NEON
void direct_neon(const Problem& pb, int64_t t0, int64_t t1, const float* split);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void direct_baseline(const Problem& pb, int64_t t0, int64_t t1, const float* split) {
  direct_planes<4>(pb, t0, t1, split);
}
#if ETFUSE_HAVE_ARM_NEON
void direct_neon(const Problem& pb, int64_t t0, int64_t t1, const float* split) {
  direct_planes<4, arm::DirectNeon>(pb, t0, t1, split);
}
#endif
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void direct_avx2(const Problem& pb, int64_t t0, int64_t t1, const float* split) {
  direct_planes<8>(pb, t0, t1, split);
}
#endif
#endif

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
