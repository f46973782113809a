// The f32 GEMM's NEON micro-kernel (aarch64): how an MR x NR tile's sums are accumulated, for
// gemm::detail::tiles_impl (the tiling, packing and epilogues are the portable ones).
//
// The portable code multiplies each B vector by one A value loaded per row and k: per k step an
// MR x NR / 4 tile costs MR scalar loads and MR pointer steps besides its B loads and multiply-adds
// (4 x 8: 18 instructions per 8 fmla). Here A's values arrive four at a time in one vector and
// each multiply-add takes its A value by lane (fmla v.4s, v.4s, v.s[l], as XNNPACK's
// f32-gemm neonfma kernels do):
//   * rows of A contiguous along k (a linear's input, a conv's [Cout, K] weight): each row's next
//     four k values in one q register, then four k steps of NR / 4 B loads and MR x NR / 4 fmla;
//   * rows of A one float apart (conv2d's transposed problems, A = the input's [K][pixels]): each
//     k step loads the MR values of its k row as q / d registers;
//   * other strides: the portable code.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "arch/arm/gemm_4x16_asm.h"
#include "core/common.h"

namespace etfuse {
namespace core {
namespace gemm {
namespace arm {

// acc[i][v] += a's lane L * b[v], for every row i and vector v.
template <int L, int MR, int NV>
ETFUSE_ALWAYS_INLINE void fma_lane(float32x4_t (&acc)[MR][NV], const float32x4_t (&a)[MR], const float* b,
                                   int64_t vstride) {
  for (int v = 0; v < NV; ++v) {
    const float32x4_t bv = vld1q_f32(b + v * vstride);
    for (int i = 0; i < MR; ++i) acc[i][v] = vfmaq_laneq_f32(acc[i][v], bv, a[i], L);
  }
}

// Four k steps: each row's next four k values in one q register, then per k step NV B vectors
// and MR x NV fmla by lane.
template <int MR, int NV>
ETFUSE_ALWAYS_INLINE void fma_four_k(float32x4_t (&acc)[MR][NV], const float* const (&ap)[MR], int64_t k,
                                     const float* b, int64_t ldp, int64_t vstride) {
  float32x4_t a[MR];
  for (int i = 0; i < MR; ++i) a[i] = vld1q_f32(ap[i] + k);
  fma_lane<0>(acc, a, b, vstride);
  fma_lane<1>(acc, a, b + ldp, vstride);
  fma_lane<2>(acc, a, b + 2 * ldp, vstride);
  fma_lane<3>(acc, a, b + 3 * ldp, vstride);
}

// Rows of A contiguous along k (a_cs == 1). kAsm: the 4 x 16 tile with B's vectors adjacent
// (vstride == 4), rows_4x16's case.
template <int MR, int NV, bool kAsm>
ETFUSE_ALWAYS_INLINE void accumulate_rows(int64_t kc, const float* const* arow, const float* pack, int64_t ldp,
                                          int64_t vstride, float32x4_t (&acc)[MR][NV]) {
  const float* ap[MR];
  for (int i = 0; i < MR; ++i) ap[i] = arow[i];
  const float* b = pack;
  int64_t k = 0;
  if constexpr (kAsm) {
    static_assert(MR == 4 && NV == 4, "rows_4x16's tile");
    rows_4x16(acc, ap, b, ldp * int64_t(sizeof(float)), kc / 4);
    for (int i = 0; i < MR; ++i) ap[i] -= kc / 4 * 4;  // back to k = 0 for the tail's indexing
    k = kc / 4 * 4;
  } else {
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] = vdupq_n_f32(0.0f);
    for (; k + 4 <= kc; k += 4, b += 4 * ldp) fma_four_k(acc, ap, k, b, ldp, vstride);
  }
  for (; k < kc; ++k, b += ldp) {
    for (int v = 0; v < NV; ++v) {
      const float32x4_t bv = vld1q_f32(b + v * vstride);
      for (int i = 0; i < MR; ++i) acc[i][v] = vfmaq_n_f32(acc[i][v], bv, ap[i][k]);
    }
  }
}

// acc[i0 + i][v] += a's lane i * b[v] for the G (4, 2 or 1) rows from i0.
template <int G, int I0, int MR, int NV>
ETFUSE_ALWAYS_INLINE void fma_rows(float32x4_t (&acc)[MR][NV], const float* a0, const float32x4_t (&bv)[NV]) {
  if constexpr (G == 4) {
    const float32x4_t a = vld1q_f32(a0 + I0);
    for (int v = 0; v < NV; ++v) {
      acc[I0][v] = vfmaq_laneq_f32(acc[I0][v], bv[v], a, 0);
      acc[I0 + 1][v] = vfmaq_laneq_f32(acc[I0 + 1][v], bv[v], a, 1);
      acc[I0 + 2][v] = vfmaq_laneq_f32(acc[I0 + 2][v], bv[v], a, 2);
      acc[I0 + 3][v] = vfmaq_laneq_f32(acc[I0 + 3][v], bv[v], a, 3);
    }
  } else if constexpr (G == 2) {
    const float32x2_t a = vld1_f32(a0 + I0);
    for (int v = 0; v < NV; ++v) {
      acc[I0][v] = vfmaq_lane_f32(acc[I0][v], bv[v], a, 0);
      acc[I0 + 1][v] = vfmaq_lane_f32(acc[I0 + 1][v], bv[v], a, 1);
    }
  } else {
    for (int v = 0; v < NV; ++v) acc[I0][v] = vfmaq_n_f32(acc[I0][v], bv[v], a0[I0]);
  }
}

// The rows from I0 on, in groups of 4, then 2, then 1 (no load past row MR - 1).
template <int I0, int MR, int NV>
ETFUSE_ALWAYS_INLINE void fma_adjacent_rows(float32x4_t (&acc)[MR][NV], const float* a0, const float32x4_t (&bv)[NV]) {
  if constexpr (MR - I0 >= 4) {
    fma_rows<4, I0>(acc, a0, bv);
    fma_adjacent_rows<I0 + 4>(acc, a0, bv);
  } else if constexpr (MR - I0 >= 2) {
    fma_rows<2, I0>(acc, a0, bv);
    fma_adjacent_rows<I0 + 2>(acc, a0, bv);
  } else if constexpr (MR - I0 == 1) {
    fma_rows<1, I0>(acc, a0, bv);
  }
}

// Rows of A one float apart: A(i, k) = a0[i + k * a_cs]. kAsm: the 4 x 16 tile with B's vectors
// adjacent (vstride == 4), adjacent_4x16's case.
template <int MR, int NV, bool kAsm>
ETFUSE_ALWAYS_INLINE void accumulate_adjacent(int64_t kc, const float* a0, int64_t a_cs, const float* pack,
                                              int64_t ldp, int64_t vstride, float32x4_t (&acc)[MR][NV]) {
  int64_t k = 0;
  if constexpr (kAsm) {
    static_assert(MR == 4 && NV == 4, "adjacent_4x16's tile");
    adjacent_4x16(acc, a0, a_cs * int64_t(sizeof(float)), pack, ldp * int64_t(sizeof(float)), kc / 4);
    k = kc / 4 * 4;
  } else {
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] = vdupq_n_f32(0.0f);
  }
  for (; k < kc; ++k, a0 += a_cs, pack += ldp) {
    float32x4_t bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = vld1q_f32(pack + v * vstride);
    fma_adjacent_rows<0>(acc, a0, bv);
  }
}

// The accumulation policy of tiles_impl for the NEON tiles (4-wide vectors).
struct NeonAccumulate {
  // A transposed problem's tile reads A in place with adjacent_4x16 even where tiles_impl would
  // prefetch the next B panel (a weight of 512 KiB or more: SqueezeNet's 512 -> 1000 head, its
  // 64 -> 256 3x3s): the rows path that prefetches is the portable loop, 31 instructions per 16
  // fmla against the kernel's 74 per 64 (the contiguous-rows kernel above drops the hint too).
  // The panel is one sequential stream, which ARM cores' hardware prefetchers follow.
  static constexpr bool kAdjacentDropsPrefetch = true;
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void rows(int64_t kc, const float* const* arow, int64_t a_cs, const float* pack,
                                        int64_t ldp, int64_t vstride, typename detail::Vec<W>::type (&acc)[MR][NR / W],
                                        const char* prefetch) {
    static_assert(W == 4, "NEON vectors hold 4 floats");
    if (a_cs != 1) {
      detail::accumulate<MR, NR, W>(kc, arow, a_cs, pack, ldp, vstride, acc, prefetch);
      return;
    }
    float32x4_t sums[MR][NR / 4];
    if (MR == 4 && NR == 16 && vstride == 4)
      accumulate_rows<MR, NR / 4, MR == 4 && NR == 16>(kc, arow, pack, ldp, vstride, sums);
    else
      accumulate_rows<MR, NR / 4, false>(kc, arow, pack, ldp, vstride, sums);
    std::memcpy(acc, sums, sizeof(sums));  // the same 16-byte vectors, two types
  }
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void adjacent(int64_t kc, const float* a0, int64_t a_cs, const float* pack, int64_t ldp,
                                            int64_t vstride, typename detail::Vec<W>::type (&acc)[MR][NR / W]) {
    static_assert(W == 4, "NEON vectors hold 4 floats");
    float32x4_t sums[MR][NR / 4];
    if (MR == 4 && NR == 16 && vstride == 4)
      accumulate_adjacent<MR, NR / 4, MR == 4 && NR == 16>(kc, a0, a_cs, pack, ldp, vstride, sums);
    else
      accumulate_adjacent<MR, NR / 4, false>(kc, a0, a_cs, pack, ldp, vstride, sums);
    std::memcpy(acc, sums, sizeof(sums));  // the same 16-byte vectors, two types
  }
};


// gemm::detail::packed_rows_impl's NEON copy (a few rows on a prepacked B): each row's next four
// k values in one q register, each of the four k steps multiplied in by lane (fmla by element, as
// the tiles) into its own set of the panel's 4 vectors of sums while U = 4 / R sets are in flight
// (16 independent fmla chains at one row, of the 32 registers).
template <int L, int R, int U>
ETFUSE_ALWAYS_INLINE void packed_fma_lane(float32x4_t (&acc)[U][R][4], const float32x4_t (&a)[R], const float* b) {
  float32x4_t bv[4];
  for (int v = 0; v < 4; ++v) bv[v] = vld1q_f32(b + 4 * v);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[L % U][r][v] = vfmaq_laneq_f32(acc[L % U][r][v], bv[v], a[r], L);
}

template <int R>
ETFUSE_ALWAYS_INLINE void packed_rows_block_neon(const Args& g, int64_t i0, int64_t p0, int64_t p1) {
  constexpr int U = 4 / R;
  constexpr int64_t P = kPanel;
  static_assert(P == 16, "a panel row is 4 q registers");
  const float* a[R];
  for (int r = 0; r < R; ++r) a[r] = g.A + (i0 + r) * g.a_rs;
  const int64_t a_cs = g.a_cs;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = g.packed_b + p * g.K * P;
    float32x4_t acc[U][R][4];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) acc[u][r][v] = vdupq_n_f32(0.0f);
    int64_t k = 0;
    for (; k + 4 <= g.K; k += 4) {
      float32x4_t av[R];
      for (int r = 0; r < R; ++r) {
        if (a_cs == 1) {
          av[r] = vld1q_f32(a[r] + k);
        } else {
          const float t[4] = {a[r][k * a_cs], a[r][(k + 1) * a_cs], a[r][(k + 2) * a_cs], a[r][(k + 3) * a_cs]};
          av[r] = vld1q_f32(t);
        }
      }
      const float* b = panel + k * P;
      packed_fma_lane<0, R, U>(acc, av, b);
      packed_fma_lane<1, R, U>(acc, av, b + P);
      packed_fma_lane<2, R, U>(acc, av, b + 2 * P);
      packed_fma_lane<3, R, U>(acc, av, b + 3 * P);
    }
    for (; k < g.K; ++k) {  // the last K % 4 rows of the panel, A by value
      for (int v = 0; v < 4; ++v) {
        const float32x4_t bv = vld1q_f32(panel + k * P + 4 * v);
        for (int r = 0; r < R; ++r) acc[0][r][v] = vfmaq_n_f32(acc[0][r][v], bv, a[r][k * a_cs]);
      }
    }
    const int64_t j0 = p * P, cols = (g.N - j0) < P ? (g.N - j0) : P;
    for (int r = 0; r < R; ++r) {
      float sums[P];
      for (int v = 0; v < 4; ++v) {
        float32x4_t t = acc[0][r][v];
        for (int u = 1; u < U; ++u) t = vaddq_f32(t, acc[u][r][v]);
        vst1q_f32(sums + 4 * v, t);
      }
      detail::store_packed_row(g, i0 + r, j0, cols, sums);
    }
  }
}

inline void packed_rows_neon_impl(const Args& g, int64_t p0, int64_t p1) {
  int64_t i = 0;
  for (; i + 2 <= g.M; i += 2) packed_rows_block_neon<2>(g, i, p0, p1);
  if (i < g.M) packed_rows_block_neon<1>(g, i, p0, p1);
}

// ---- A packed per 4-row tile (tiles_neon's path for a prepacked B) ------------------------------
// A linear's rows are read by the tile once per column panel: with each row's four k values in
// its own register, 4 loads per 64 fmla. Packed once per call as [k][rows] per tile of 4 (or 3)
// rows, a tile's four k steps are one ld1 of four (three) registers (packed_4x16, packed_3x16),
// and packing costs 5 instructions per 16 floats (4 loads, one st4), paid back from the second
// panel on.
constexpr int64_t kPackAMaxFloats = int64_t(1) << 17;  // 512 KiB: the rows of ViT-B's 37 tokens x 3072
constexpr int64_t kPackAMinPanels = 4;
constexpr int64_t kPackAMaxBlocks = 64;  // row blocks: one flag each on the stack

inline bool use_packed_a(const Args& g, int64_t mblocks) {
  return mblocks > 0 && mblocks <= kPackAMaxBlocks && g.packed_b != nullptr && g.packed_b_i8 == nullptr && g.pack == nullptr && g.a_cs == 1 &&
      g.c_cs == 1 && g.M >= 3 && g.K >= 4 && g.M * g.K <= kPackAMaxFloats && packed_panels(g.N) >= kPackAMinPanels;
}

// The accumulation of a tile whose A is packed [k][MR] (MR 4 or 3; arow[0] at its slice's first
// k); other shapes (never given packed A) take NeonAccumulate's.
struct PackedANeonAccumulate {
  static constexpr bool kAdjacentDropsPrefetch = true;  // as NeonAccumulate's
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void rows(int64_t kc, const float* const* arow, int64_t a_cs, const float* pack,
                                        int64_t ldp, int64_t vstride, typename detail::Vec<W>::type (&acc)[MR][NR / W],
                                        const char* prefetch) {
    if constexpr ((MR == 4 || MR == 3) && NR == 16) {
      float32x4_t sums[MR][4];
      const float* a = arow[0];
      const float* b = pack;
      if constexpr (MR == 4)
        packed_4x16(sums, a, b, ldp * int64_t(sizeof(float)), kc / 4);
      else
        packed_3x16(sums, a, b, ldp * int64_t(sizeof(float)), kc / 4);
      for (int64_t k = kc / 4 * 4; k < kc; ++k, a += MR, b += ldp) {
        float32x4_t bv[4];
        for (int v = 0; v < 4; ++v) bv[v] = vld1q_f32(b + v * vstride);
        fma_adjacent_rows<0>(sums, a, bv);
      }
      std::memcpy(acc, sums, sizeof(sums));
    } else {
      NeonAccumulate::rows<MR, NR, W>(kc, arow, a_cs, pack, ldp, vstride, acc, prefetch);
    }
  }
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void adjacent(int64_t kc, const float* a0, int64_t a_cs, const float* pack, int64_t ldp,
                                            int64_t vstride, typename detail::Vec<W>::type (&acc)[MR][NR / W]) {
    NeonAccumulate::adjacent<MR, NR, W>(kc, a0, a_cs, pack, ldp, vstride, acc);  // not reached: C's rows contiguous
  }
};

// The rows [ib, ie) of a block in tiles_impl's near-equal tiles: each tile of mr = 4 or 3 rows
// packed at p + i0 * K as [K][mr] (st4 / st3 interleave the rows' k values); shorter tiles
// read A in place.
inline void pack_a_block(const Args& g, int64_t ib, int64_t ie, float* p) {
  const int64_t ntiles = (ie - ib + 3) / 4, base = (ie - ib) / ntiles, taller = (ie - ib) % ntiles;
  for (int64_t t = 0, i0 = ib; t < ntiles; ++t) {
    const int64_t mr = base + (t < taller ? 1 : 0);
    const float* r0 = g.A + i0 * g.a_rs;
    const float *r1 = r0 + g.a_rs, *r2 = r1 + g.a_rs, *r3 = r2 + g.a_rs;
    float* d = p + i0 * g.K;
    int64_t k = 0;
    if (mr == 4) {
      for (; k + 4 <= g.K; k += 4, d += 16) {
        const float32x4x4_t v = {{vld1q_f32(r0 + k), vld1q_f32(r1 + k), vld1q_f32(r2 + k), vld1q_f32(r3 + k)}};
        vst4q_f32(d, v);
      }
      for (; k < g.K; ++k, d += 4) d[0] = r0[k], d[1] = r1[k], d[2] = r2[k], d[3] = r3[k];
    } else if (mr == 3) {
      for (; k + 4 <= g.K; k += 4, d += 12) {
        const float32x4x3_t v = {{vld1q_f32(r0 + k), vld1q_f32(r1 + k), vld1q_f32(r2 + k)}};
        vst3q_f32(d, v);
      }
      for (; k < g.K; ++k, d += 3) d[0] = r0[k], d[1] = r1[k], d[2] = r2[k];
    }
    i0 += mr;
  }
}

// One buffer per thread for every tiles_packed_a_impl.
inline float* packed_a_buffer(size_t n) {
  thread_local std::vector<float> buffer;
  return aligned_floats(buffer, n);
}

// A packed tile's sums over the whole K (packed_4x16 / packed_3x16, then K % 4 steps by value).
template <int MR>
ETFUSE_ALWAYS_INLINE void packed_sums(int64_t K, const float* a, const float* b, float32x4_t (&acc)[MR][4]) {
  if constexpr (MR == 4)
    packed_4x16(acc, a, b, kPanel * int64_t(sizeof(float)), K / 4);
  else
    packed_3x16(acc, a, b, kPanel * int64_t(sizeof(float)), K / 4);
  for (int64_t k = K / 4 * 4; k < K; ++k, a += MR, b += kPanel) {
    float32x4_t bv[4];
    for (int v = 0; v < 4; ++v) bv[v] = vld1q_f32(b + 4 * v);
    fma_adjacent_rows<0>(acc, a, bv);
  }
}

// A full panel's tile of MR (4 or 3) packed rows into C: + bias (one per column), + residual
// (rows contiguous), clamp, chosen at compile time. micro_to_c's epilogue decides each of these per
// vector at run time (with the bias's and the residual's strides): about 25 instructions a
// vector, a tenth of a K = 256 tile's.
template <int MR, bool kBias, bool kResidual, bool kClamp>
ETFUSE_ALWAYS_INLINE void packed_tile_to_c(const Args& g, const float* a, const float* b, int64_t i0, int64_t j0) {
  float32x4_t acc[MR][4];
  packed_sums<MR>(g.K, a, b, acc);
  float32x4_t bias[4];
  if (kBias)
    for (int v = 0; v < 4; ++v) bias[v] = vld1q_f32(g.bias + j0 + 4 * v);
  const float32x4_t lo = vdupq_n_f32(g.act_min), hi = vdupq_n_f32(g.act_max);
  for (int i = 0; i < MR; ++i) {
    float* c = g.C + (i0 + i) * g.c_rs + j0;
    const float* r = kResidual ? g.residual + (i0 + i) * g.residual_rs + j0 : nullptr;
    for (int v = 0; v < 4; ++v) {
      float32x4_t x = acc[i][v];
      if (kBias) x = vaddq_f32(x, bias[v]);
      if (kResidual) x = vaddq_f32(x, vld1q_f32(r + 4 * v));
      if (kClamp) x = vminq_f32(vmaxq_f32(x, lo), hi);  // fmax / fmin keep NaN, as clamp_act
      vst1q_f32(c + 4 * v, x);
    }
  }
}

// tiles_impl<4, 16, 4> for use_packed_a's problems: the same tasks and tiles, B's panels read in
// place over the whole K (XNNPACK's GEMMs do not slice K either: a slice's epilogue re-read and
// re-wrote C), A's tiles of 4 and 3 rows from the packed copy (each row block packed once, when
// this range first reaches it). Full panels with a plain epilogue (`plain`) store straight from
// the registers; the others go through tiles_impl's rows_tile.
template <bool kBias, bool kResidual, bool kClamp>
void tiles_packed_a_impl(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  constexpr int MR = 4, NR = 16, W = 4;
  float* const pa = packed_a_buffer(static_cast<size_t>(g.M * g.K));
  bool packed[kPackAMaxBlocks] = {};
  alignas(64) float tile[MR][NR];
  const bool plain = (!g.scale && (!g.bias || (g.bias_rs == 0 && g.bias_cs == 1)) &&
                      (!g.residual || g.residual_cs == 1));
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t panel = t / mblocks, block = t % mblocks;
    const int64_t j0 = panel * NR, nr = (g.N - j0) < NR ? (g.N - j0) : NR;
    const int64_t ib = block * mc, ie = (ib + mc) < g.M ? (ib + mc) : g.M;
    if (!packed[block]) {
      pack_a_block(g, ib, ie, pa);
      packed[block] = true;
    }
    const float* b = g.packed_b + panel * g.K * kPanel;
    const int64_t ntiles = (ie - ib + MR - 1) / MR, base = (ie - ib) / ntiles, taller = (ie - ib) % ntiles;
    for (int64_t ti = 0, i0 = ib; ti < ntiles; ++ti) {
      const int64_t mr = base + (ti < taller ? 1 : 0);
      const float* arow[MR];
      if (mr >= 3 && plain && nr == NR) {
        if (mr == 4)
          packed_tile_to_c<4, kBias, kResidual, kClamp>(g, pa + i0 * g.K, b, i0, j0);
        else
          packed_tile_to_c<3, kBias, kResidual, kClamp>(g, pa + i0 * g.K, b, i0, j0);
      } else if (mr >= 3) {
        arow[0] = pa + i0 * g.K;
        detail::rows_tile<MR, NR, W, PackedANeonAccumulate>(g, mr, i0, j0, nr, g.K, arow, b, kPanel, W, tile, true,
                                                            true, nullptr);
      } else {
        for (int i = 0; i < mr; ++i) arow[i] = g.A + (i0 + i) * g.a_rs;
        detail::rows_tile<MR, NR, W, NeonAccumulate>(g, mr, i0, j0, nr, g.K, arow, b, kPanel, W, tile, true, true,
                                                     nullptr);
      }
      i0 += mr;
    }
  }
}

inline void tiles_packed_a(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  const bool bias = g.bias != nullptr, residual = g.residual != nullptr, clamp = g.clamp;
  const int which = (bias ? 4 : 0) + (residual ? 2 : 0) + (clamp ? 1 : 0);
  constexpr void (*impl[8])(const Args&, int64_t, int64_t, int64_t, int64_t) = {
      &tiles_packed_a_impl<false, false, false>, &tiles_packed_a_impl<false, false, true>,
      &tiles_packed_a_impl<false, true, false>,  &tiles_packed_a_impl<false, true, true>,
      &tiles_packed_a_impl<true, false, false>,  &tiles_packed_a_impl<true, false, true>,
      &tiles_packed_a_impl<true, true, false>,   &tiles_packed_a_impl<true, true, true>};
  impl[which](g, t0, t1, mblocks, mc);
}

}  // namespace arm
}  // namespace gemm
}  // namespace core
}  // namespace etfuse
