// The phase-plane GEMM's tiles (tap_panels, AVX2 and AVX-512): rows of output channels times
// panels of output pixels, B's rows read in place from the phase planes; run_phase_gemm
// (phase_gemm.h) runs them.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// A spatial conv as the GEMM out[co, q] = sum_k weight[co, k] * tap[k][q] over the image's
// phase planes (split_phases; stride 1 is one phase: the zero-padded image), with the output
// pixels q = oh * SW + ow laid out on the planes' rows (SW = OW plus the kernel's reach): every
// B row is then a contiguous run of a plane, read in place, and the columns ow >= OW (the reach,
// 2 of 34 on a 32-wide map with a 3x3 kernel) are computed and dropped. Packing B panels out of
// the planes (one copy per k and panel) cost 80% of the multiply-adds' time at 16 output
// channels (ResNet8's 16 -> 16 on 32x32: 53 us, 36% of it the copy).
struct TapTask {
  const Problem* pb;
  const float* const* tap;  // [K]: where k's plane run starts (PhaseGeom::taps)
  const float* w;  // the task's weight rows: [Mg][K], row stride w_rs, contiguous along k
  int64_t w_rs, K, Mg, co0, n, SW, Q;  // Q = rows * SW: the columns computed
  int64_t oh0;  // the output row of column 0
};

// A panel's valid columns [q0, q0 + NR): runs of ow < OW, one per output row the panel spans,
// from column from[r] of the panel to output offset to[r] (worked out once per panel: a division
// per run and row cost more than the multiply-adds on DS-CNN's 5-wide maps). With 16-wide
// vectors the runs are also cut at the vectors' edges into `pieces`: vector v's lanes `mask`
// go to output offset `at` + lane (tap_tile's masked stores, straight from the registers).
template <int NR, int W>
struct TapRuns {
  int64_t from[NR], to[NR], len[NR];
  int n = 0;
  struct Piece {
    int64_t at;
    int v;
    uint32_t mask;
  };
  // a run meets at most one vector more than it holds whole, and the runs together cross at
  // most NR / 16 - 1 vector edges
  Piece pieces[NR + NR / 16];
  int npieces = 0;
  TapRuns(const TapTask& t, int64_t q0) {
    const int64_t OW = t.pb->lo.sizes[3], hs = t.pb->lo.strides[2], ws = t.pb->lo.strides[3];
    for (int64_t j = 0, oh = q0 / t.SW, ow = q0 % t.SW; j < NR && oh * t.SW + ow < t.Q; ++oh, ow = 0) {
      if (ow < OW) {
        from[n] = j;
        to[n] = (t.oh0 + oh) * hs + ow * ws;
        len[n++] = (OW - ow) < (NR - j) ? (OW - ow) : (NR - j);
      }
      j += t.SW - ow;
    }
    if constexpr (W == 16) {  // (only tap_tile_masked reads them)
      for (int r = 0; r < n; ++r) {
        for (int64_t c = from[r], end = from[r] + len[r]; c < end;) {
          const int v = static_cast<int>(c / 16);
          const int64_t stop = (v + 1) * 16 < end ? (v + 1) * 16 : end;
          pieces[npieces++] = {to[r] - from[r] + v * 16, v, ((1u << (stop - v * 16)) - 1u) & ~((1u << (c - v * 16)) - 1u)};
          c = stop;
        }
      }
    }
  }
};

// acc = the sums of rows [i0, i0 + MR) of the task's weight times columns [q0, q0 + NR) of the
// tap runs.
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void tap_sums(const TapTask& t, int64_t i0, int64_t q0, typename gemm::detail::Vec<W>::type (&acc)[MR][NR / W]) {
  typedef typename gemm::detail::Vec<W>::type vf;
  constexpr int NV = NR / W;
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = vf{};
  const float* a[MR];
  for (int i = 0; i < MR; ++i) a[i] = t.w + (i0 + i) * t.w_rs;
  for (int64_t k = 0; k < t.K; ++k) {
    const float* b = t.tap[k] + q0;
    vf bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = gemm::detail::load<W>(b + v * W);
    for (int i = 0; i < MR; ++i) {
      const float s = a[i][k];
      for (int v = 0; v < NV; ++v) acc[i][v] += s * bv[v];
    }
  }
}

// Rows [i0, i0 + MR) of columns [q0, q0 + NR): the sums, the epilogue (per-channel scale, bias,
// clamp), then each row's valid columns (`runs`) into the output plane.
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void tap_tile(const TapTask& t, const TapRuns<NR, W>& runs, int64_t i0, int64_t q0) {
  typedef typename gemm::detail::Vec<W>::type vf;
  constexpr int NV = NR / W;
  const Problem& pb = *t.pb;
  vf acc[MR][NV];
  tap_sums<MR, NR, W>(t, i0, q0, acc);
  float lo_s, hi_s;
  clamp_bounds(pb.p, lo_s, hi_s);
  const vf lo = vf{} + lo_s, hi = vf{} + hi_s;
  const int64_t ws = pb.lo.strides[3];
  alignas(64) float row[NR];
  for (int i = 0; i < MR; ++i) {
    const int64_t co = t.co0 + i0 + i;
    const vf sc = vf{} + (pb.scale ? pb.scale[co * pb.scale_s] : 1.0f);
    const vf bias = vf{} + (pb.bias ? pb.bias[co * pb.bias_s] : 0.0f);
    for (int v = 0; v < NV; ++v) {
      vf x = acc[i][v] * sc + bias;
      if (!pb.residual) x = x < lo ? lo : (x > hi ? hi : x);  // clamp_act lane by lane (NaN kept)
      gemm::detail::store<W>(row + v * W, x);
    }
    const int64_t at = t.n * pb.lo.strides[0] + co * pb.lo.strides[1];
    float* plane = pb.out + at;
    for (int r = 0; r < runs.n; ++r) {
      if (pb.residual && ws == 1) {  // the skip connection added on the way out, then the clamp
        gemm::detail::add_clamp_row<W>(plane + runs.to[r], row + runs.from[r], pb.residual + at + runs.to[r],
                                       runs.len[r], lo_s, hi_s);
      } else if (pb.residual) {
        for (int64_t c = 0; c < runs.len[r]; ++c) {
          const int64_t o = runs.to[r] + c * ws;
          plane[o] = gemm::clamp_act(row[runs.from[r] + c] + pb.residual[at + o], lo_s, hi_s);
        }
      } else if (ws == 1) {
        copy_row<W>(plane + runs.to[r], row + runs.from[r], runs.len[r]);  // inline: a libc memcpy per run was 10% of the conv's time
      } else {
        for (int64_t c = 0; c < runs.len[r]; ++c) plane[runs.to[r] + c * ws] = row[runs.from[r] + c];
      }
    }
  }
}

#if ETFUSE_HAVE_X86_DISPATCH
// tap_tile on AVX-512 with output rows at stride 1: each piece of a run (TapRuns::pieces) is one
// masked store of the vector's sums (with a residual, one masked load too). tap_tile's rows go
// through a stack buffer and a copy of variable length per run: half of a 3-channel stem's time
// (K = 27: SqueezeNet's 3 -> 64 on 96x96). Called per tile, not inlined: the masked moves are
// AVX-512 intrinsics, which do not inline into the generic templates that call this.
template <int MR, int NR>
ETFUSE_TARGET_AVX512 void tap_tile_masked(const TapTask& t, const TapRuns<NR, 16>& runs, int64_t i0, int64_t q0) {
  typedef typename gemm::detail::Vec<16>::type vf;
  constexpr int NV = NR / 16;
  const Problem& pb = *t.pb;
  vf acc[MR][NV];
  tap_sums<MR, NR, 16>(t, i0, q0, acc);
  float lo_s, hi_s;
  clamp_bounds(pb.p, lo_s, hi_s);
  const vf lo = vf{} + lo_s, hi = vf{} + hi_s;
  for (int i = 0; i < MR; ++i) {
    const int64_t co = t.co0 + i0 + i;
    const vf sc = vf{} + (pb.scale ? pb.scale[co * pb.scale_s] : 1.0f);
    const vf bias = vf{} + (pb.bias ? pb.bias[co * pb.bias_s] : 0.0f);
    const int64_t at = t.n * pb.lo.strides[0] + co * pb.lo.strides[1];
    float* plane = pb.out + at;
    const float* res = pb.residual ? pb.residual + at : nullptr;
    vf x[NV];
    for (int v = 0; v < NV; ++v) {
      x[v] = acc[i][v] * sc + bias;
      if (!res) x[v] = x[v] < lo ? lo : (x[v] > hi ? hi : x[v]);  // clamp_act lane by lane (NaN kept)
    }
    for (int q = 0, np = runs.npieces; q < np; ++q) {  // np local: the stores may alias `runs`
      const auto& piece = runs.pieces[q];
      const __mmask16 m = static_cast<__mmask16>(piece.mask);
      __m512 y;
      std::memcpy(&y, &x[piece.v], sizeof(y));
      if (res) {  // the skip connection added on the way out, then the clamp
        vf sum;
        const __m512 added = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, res + piece.at));
        std::memcpy(&sum, &added, sizeof(sum));
        sum = sum < lo ? lo : (sum > hi ? hi : sum);
        std::memcpy(&y, &sum, sizeof(y));
      }
      _mm512_mask_storeu_ps(plane + piece.at, m, y);
    }
  }
}
#endif

// rows_tile's dispatch: a tile of exactly mr <= MR rows
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void tap_rows(const TapTask& t, const TapRuns<NR, W>& runs, int64_t mr, int64_t i0, int64_t q0) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      tap_rows<MR - 1, NR, W>(t, runs, mr, i0, q0);
      return;
    }
  }
#if ETFUSE_HAVE_X86_DISPATCH
  if constexpr (W == 16) {
    if (t.pb->lo.strides[3] == 1) {
      tap_tile_masked<MR, NR>(t, runs, i0, q0);
      return;
    }
  }
#endif
  tap_tile<MR, NR, W>(t, runs, i0, q0);
}

// Tasks [b, e): task = column panel, all the output channels of the group in row tiles of
// near-equal height (as gemm::tiles_impl: 13 rows as 7 + 6, not 8 + 5).
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void tap_panels(const TapTask& t, int64_t b, int64_t e) {
  // a plain loop, not a lambda: a lambda in a target("avx512f") function is compiled for the
  // base ISA (its 64-byte vector code was emulated: 35x slower)
  const int64_t ntiles = (t.Mg + MR - 1) / MR, base = t.Mg / ntiles, taller = t.Mg % ntiles;
  for (int64_t panel = b; panel < e; ++panel) {
    const TapRuns<NR, W> runs(t, panel * NR);
    for (int64_t tile = 0, i0 = 0; tile < ntiles; ++tile) {
      const int64_t mr = base + (tile < taller ? 1 : 0);
      tap_rows<MR, NR, W>(t, runs, mr, i0, panel * NR);
      i0 += mr;
    }
  }
}

// Compiled once per library in core/kernels.cpp; panels of kTapPanelAvx2 / kTapPanelAvx512
// columns, tiles of kTapRowsAvx2 / kTapRowsAvx512 output channels. (Tiles of 16 x 16 on
// AVX-512, which compute fewer dropped columns on 8x8 maps, were slower there: 64 -> 64 46 ->
// 50 us; 12 x 32 and 6 x 64 too.)
constexpr int kTapPanelAvx2 = 16, kTapPanelAvx512 = 32, kTapRowsAvx2 = 6, kTapRowsAvx512 = 8;
#if ETFUSE_HAVE_X86_DISPATCH  // (to run_phase_gemm: the phase-plane GEMM runs on AVX2 and up)
ETFUSE_TARGET_AVX2 void tap_panels_avx2(const TapTask& t, int64_t b, int64_t e);
ETFUSE_TARGET_AVX512 void tap_panels_avx512(const TapTask& t, int64_t b, int64_t e);
#if defined(ETFUSE_CORE_KERNELS)
ETFUSE_TARGET_AVX2 void tap_panels_avx2(const TapTask& t, int64_t b, int64_t e) {
  tap_panels<kTapRowsAvx2, kTapPanelAvx2, 8>(t, b, e);
}
ETFUSE_TARGET_AVX512 void tap_panels_avx512(const TapTask& t, int64_t b, int64_t e) {
  tap_panels<kTapRowsAvx512, kTapPanelAvx512, 16>(t, b, e);
}
#endif
#endif  // ETFUSE_HAVE_X86_DISPATCH

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
