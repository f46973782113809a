// The one GEMM of the float cores (linear_relu, linear_act, addmm_relu through gemm_entry.h;
// conv2d_act's implicit GEMM):
//
//   C[i, j] = clamp(scale[i, j] * sum_k A[i, k] * B[k, j] + bias[i, j], act_min, act_max)
//
// relu is the clamp [0, inf); `clamp = false` is the identity. Every operand is a pointer and
// two strides (scale and bias strides may be 0 to broadcast, e.g. one value per output channel;
// a null scale is 1, a null bias is 0). B is packed per panel of NR columns into a contiguous [KC][NR] buffer (this
// also absorbs a transposed B, e.g. linear's weight read as stored [N, K]), or comes packed
// already (`Args::packed_b`: a constant weight packed once, at fuse time); an MR x NR register
// tile is accumulated over KC-long slices with plain vector arithmetic; bias and the clamp run
// in the epilogue of the last K slice. A caller-supplied packer (`Args::pack`) replaces the
// strided B read: conv2d packs its input windows straight into the panel (implicit GEMM).
// Work is split over (column panel, row block) tiles.
//
// The micro-kernel is written once (GCC vector extensions) and instantiated for the SSE2
// baseline (MR=4, NR=8, 4-wide), AVX2+FMA (MR=6, NR=16, 8-wide) and AVX-512F (MR=12, NR=32,
// 16-wide: about 1.5x the AVX2 one on this Xeon), chosen at runtime. A hand-written
// micro-kernel can replace `detail::micro` without touching the op files. The per-ISA entry
// points (tiles_*, dot_cols_*) are compiled once per library, in core/kernels.cpp
// (-DETFUSE_CORE_KERNELS); the op files see their declarations only.
#pragma once

#include "common.h"

namespace etfuse {
namespace core {
namespace gemm {

struct Args {
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t a_rs = 0, a_cs = 0;  // A(i, k) = A[i * a_rs + k * a_cs]
  const float* B = nullptr;
  int64_t b_rs = 0, b_cs = 0;  // B(k, j) = B[k * b_rs + j * b_cs]
  float* C = nullptr;
  int64_t c_rs = 0, c_cs = 0;
  const float* bias = nullptr;  // may be null
  int64_t bias_rs = 0, bias_cs = 0;
  // Optional per-output scale applied before the bias (a batch norm folded per call).
  const float* scale = nullptr;
  int64_t scale_rs = 0, scale_cs = 0;
  bool clamp = true;  // the epilogue clamps to [act_min, act_max] (relu by default)
  float act_min = 0.0f, act_max = __builtin_inff();
  // Optional B packer (implicit GEMM, e.g. conv2d reading its input window by window): fills
  // pack[k][0:NR] with B(k0 + k, j0 : j0 + nr) for k < kc, zero past nr. Null: B via strides.
  void (*pack)(const void* ctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack) = nullptr;
  const void* pack_ctx = nullptr;
  // Take the dot-product path at any M (the caller arranged a_cs == 1 and b_rs == 1 and knows
  // the columns are too few for NR-wide panels).
  bool dot = false;
  // B packed ahead of time (B and the strides are then unused): panels of kPanel columns,
  // panel p = packed_b[p * K * kPanel : (p + 1) * K * kPanel] laid out [K][kPanel], columns
  // past N zero: packed[p][k][c] = B(k, p * kPanel + c) (the ATen pattern of etfuse's
  // pack_gemm_weight, backend_ops/prepacked_ops.py). The AVX2 tiles read it in place.
  const float* packed_b = nullptr;
  // The same layout in int8 (etfuse::quantized_*_packed: integer weights, symmetric): each K
  // slice of a panel is converted to floats as it is packed, so the weight stays 1 byte a value.
  const int8_t* packed_b_i8 = nullptr;
  // B's rows are contiguous (b_cs == 1; a 1x1 conv's input planes): a full NR-wide panel is read
  // in place with row stride b_rs, only a last partial panel is packed (by `pack` or the strides).
  bool b_direct = false;
  // Optional values added to the result before the clamp (linear_act's residual, a skip
  // connection): read by the first K slice where the later ones read C's partial sums.
  const float* residual = nullptr;
  int64_t residual_rs = 0, residual_cs = 0;
};

// Column width of a prepacked B panel: the AVX2 micro-kernel's NR, the ISA this project tunes for;
// the other ISAs copy their NR-wide panels out of it.
constexpr int64_t kPanel = 16;

inline int64_t packed_panels(int64_t N) { return (N + kPanel - 1) / kPanel; }

// clamp that keeps NaN (like torch.clamp / relu / hardtanh).
ETFUSE_ALWAYS_INLINE float clamp_act(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

namespace detail {

constexpr int64_t kKC = 256;  // K slice: a packed panel is kKC * NR floats (<= 32 KiB)
constexpr int64_t kMC = 96;   // rows per task (multiple of every MR), fewer when tasks are few
constexpr int64_t kMinTasks = 4;  // below this, smaller row blocks (each repacks its B panel)
constexpr int64_t kRowsOuterMaxK = 64, kRowsOuterMC = 24;  // see run()
constexpr int64_t kPrefetchMinBytes = int64_t(512) << 10;  // see tiles_impl

// Vector of W floats (GCC vector extension); xmm, ymm or zmm code depending on the target.
template <int W>
struct Vec {
  typedef float type __attribute__((vector_size(W * 4)));
  typedef float unaligned __attribute__((vector_size(W * 4), aligned(4), may_alias));
};

// One vector stored at any float address. A 32-byte memcpy from a vector inside a
// target("avx2") function is expanded as the base ISA's 16-byte pieces through general
// registers (5 instructions and a stack round trip per vector in depthwise_channels' sums).
template <int W>
ETFUSE_ALWAYS_INLINE void store(float* p, const typename Vec<W>::type& v) {
  *reinterpret_cast<typename Vec<W>::unaligned*>(p) = v;
}
template <int W>
ETFUSE_ALWAYS_INLINE typename Vec<W>::type load(const float* p) {
  return *reinterpret_cast<const typename Vec<W>::unaligned*>(p);
}

// N floats (a compile-time count) as whole vectors of 16, 8, 4, then single floats.
template <int N>
ETFUSE_ALWAYS_INLINE void copy_floats(float* dst, const float* src) {
  if constexpr (N >= 16) {
    store<16>(dst, load<16>(src));
    copy_floats<N - 16>(dst + 16, src + 16);
  } else if constexpr (N >= 8) {
    store<8>(dst, load<8>(src));
    copy_floats<N - 8>(dst + 8, src + 8);
  } else if constexpr (N >= 4) {
    store<4>(dst, load<4>(src));
    copy_floats<N - 4>(dst + 4, src + 4);
  } else if constexpr (N >= 1) {
    *dst = *src;
    copy_floats<N - 1>(dst + 1, src + 1);
  }
}

// dst[j] = clamp(src[j] + res[j], lo, hi) for j < n (a residual added where a tile is stored:
// conv2d's phase-plane rows, the transposed epilogue's columns), by whole vectors, the last one
// overlapping the one before (dst aliases neither src nor res, so the overlap writes the same
// values), narrower ones under W.
template <int W>
ETFUSE_ALWAYS_INLINE void add_clamp_vector(float* dst, const float* src, const float* res,
                                           const typename Vec<W>::type& lo,
                                           const typename Vec<W>::type& hi) {
  typename Vec<W>::type x = load<W>(src) + load<W>(res);
  store<W>(dst, x < lo ? lo : (x > hi ? hi : x));  // clamp_act lane by lane (NaN kept)
}
template <int W>
ETFUSE_ALWAYS_INLINE void add_clamp_row(float* dst, const float* src, const float* res, int64_t n, float lo, float hi) {
  typedef typename Vec<W>::type vf;
  if (n >= W) {
    const vf vlo = vf{} + lo, vhi = vf{} + hi;
    int64_t j = 0;
    for (; j + W <= n; j += W) add_clamp_vector<W>(dst + j, src + j, res + j, vlo, vhi);
    if (j < n) add_clamp_vector<W>(dst + n - W, src + n - W, res + n - W, vlo, vhi);
  } else if constexpr (W > 4) {
    add_clamp_row<W / 2>(dst, src, res, n, lo, hi);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = clamp_act(src[j] + res[j], lo, hi);
  }
}

// v[r][c] -> v[c][r] for a W x W block (W a power of 2): log2(W) rounds of zipping row i with
// row i + W / 2 (the perfect shuffle). GCC lowers each zip to the ISA's shuffles.
template <int W>
struct LaneIndex {  // a member typedef: a function-local one is not dependent when indexed
  typedef int32_t type __attribute__((vector_size(W * 4)));
};

template <int W>
ETFUSE_ALWAYS_INLINE void transpose_block(typename Vec<W>::type (&v)[W]) {
  typedef typename Vec<W>::type vf;
  typedef typename LaneIndex<W>::type vi;
  vi lo, hi;
  for (int i = 0; i < W / 2; ++i) {
    lo[2 * i] = i;
    lo[2 * i + 1] = W + i;
    hi[2 * i] = W / 2 + i;
    hi[2 * i + 1] = W + W / 2 + i;
  }
  for (int round = 1; round < W; round *= 2) {
    vf z[W];
    for (int i = 0; i < W / 2; ++i) {
      z[2 * i] = __builtin_shuffle(v[i], v[i + W / 2], lo);
      z[2 * i + 1] = __builtin_shuffle(v[i], v[i + W / 2], hi);
    }
    for (int i = 0; i < W; ++i) v[i] = z[i];
  }
}

template <int NR>
ETFUSE_ALWAYS_INLINE void pack_b(const Args& g, int64_t k0, int64_t kc, int64_t j0, int64_t nr, float* pack) {
  const float* B = g.B + k0 * g.b_rs + j0 * g.b_cs;
  if (nr < NR) {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t j = nr; j < NR; ++j) pack[k * NR + j] = 0.0f;
  }
  if (g.b_cs <= g.b_rs) {  // rows of B contiguous-ish: k outer
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t j = 0; j < nr; ++j) pack[k * NR + j] = B[k * g.b_rs + j * g.b_cs];
  } else {  // columns of B contiguous (transposed B, e.g. a [N, K] weight): j outer
    for (int64_t j = 0; j < nr; ++j)
      for (int64_t k = 0; k < kc; ++k) pack[k * NR + j] = B[k * g.b_rs + j * g.b_cs];
  }
}

// pack[k][0:NR] = float(B(k0 + k, j0 : j0 + NR)) out of the prepacked panels (float, or int8:
// quantized_*_packed), for an NR other than kPanel or int8 (0 past the last panel's columns,
// which are 0 already past N). Row by row: each k row of a panel is kPanel contiguous values
// (element by element, with the stride of a panel row, the AVX-512 tiles' copy took longer than
// their multiply-adds).
template <int NR, class T>
ETFUSE_ALWAYS_INLINE void copy_packed(const Args& g, const T* packed, int64_t k0, int64_t kc, int64_t j0,
                                      float* pack) {
  static_assert(NR % kPanel == 0 || kPanel % NR == 0, "panels of NR columns out of kPanel-wide ones");
  constexpr int64_t per_row = NR < kPanel ? NR : kPanel;
  for (int64_t q = 0; q < NR / per_row; ++q) {
    const int64_t col = j0 + q * per_row, p = col / kPanel;
    float* dst = pack + q * per_row;
    if (p >= packed_panels(g.N)) {  // past the last panel: zero columns
      for (int64_t k = 0; k < kc; ++k) std::memset(dst + k * NR, 0, sizeof(float) * per_row);
      continue;
    }
    const T* src = packed + p * g.K * kPanel + k0 * kPanel + col % kPanel;
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t c = 0; c < per_row; ++c) dst[k * NR + c] = static_cast<float>(src[k * kPanel + c]);
  }
}

// acc[MR][NR / W] = sum_k A(rows, k) * B's k row, in vectors of W floats: vector v of row k at
// pack + k * ldp + v * vstride (vstride W: one NR-wide panel; the AVX-512 tiles read two 16-wide
// prepacked panels in place, vstride = one panel's size)
template <int MR, int NR, int W, bool Prefetch>
ETFUSE_ALWAYS_INLINE void accumulate_loop(int64_t kc, const float* const* arow, int64_t a_cs, const float* pack,
                                          int64_t ldp, int64_t vstride, const char* prefetch,
                                          typename Vec<W>::type (&acc)[MR][NR / W]) {
  typedef typename Vec<W>::type vf;
  constexpr int NV = NR / W;
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = vf{};
  const float* ap[MR];
  for (int i = 0; i < MR; ++i) ap[i] = arow[i];
  for (int64_t k = 0; k < kc; ++k) {
    if (Prefetch) __builtin_prefetch(prefetch + k * kPanel * sizeof(float), 0, 2);  // one k row of a packed panel
    vf bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], pack + k * ldp + v * vstride, sizeof(vf));
    for (int i = 0; i < MR; ++i) {
      const float s = ap[i][k * a_cs];
      for (int v = 0; v < NV; ++v) acc[i][v] += s * bv[v];
    }
  }
}

// accumulate_loop for rows of A one float apart (A(i, k) = a0[i + k * a_cs]: the transposed
// problems, A = the input's [K][pixels] read as pixels x K): one pointer, the rows at
// immediate offsets. With MR row pointers (12 on AVX-512) they were spilled and reloaded every k,
// as many loads as the broadcasts.
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void accumulate_adjacent(int64_t kc, const float* a0, int64_t a_cs, const float* pack,
                                              int64_t ldp, int64_t vstride, typename Vec<W>::type (&acc)[MR][NR / W]) {
  typedef typename Vec<W>::type vf;
  constexpr int NV = NR / W;
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = vf{};
  for (int64_t k = 0; k < kc; ++k, a0 += a_cs) {
    vf bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], pack + k * ldp + v * vstride, sizeof(vf));
    for (int i = 0; i < MR; ++i) {
      const float s = a0[i];
      for (int v = 0; v < NV; ++v) acc[i][v] += s * bv[v];
    }
  }
}

// accumulate_loop; with `prefetch` (may be null) it also prefetches the kc cache lines from there,
// one per k step (tiles_impl: the next slice of a prepacked B).
template <int MR, int NR, int W>
ETFUSE_ALWAYS_INLINE void accumulate(int64_t kc, const float* const* arow, int64_t a_cs, const float* pack,
                                     int64_t ldp, int64_t vstride, typename Vec<W>::type (&acc)[MR][NR / W],
                                     const char* prefetch = nullptr) {
  if (prefetch)
    accumulate_loop<MR, NR, W, true>(kc, arow, a_cs, pack, ldp, vstride, prefetch, acc);
  else
    accumulate_loop<MR, NR, W, false>(kc, arow, a_cs, pack, ldp, vstride, prefetch, acc);
}

// How a tile's sums are accumulated: the portable vector code above (every ISA's tiles but
// NEON's). A per-ISA micro-kernel is another such struct (arch/arm/gemm_neon.h), given to
// tiles_impl; the tiling, packing and epilogues above and below it are the same for all.
struct PortableAccumulate {
  // Whether micro_to_c_transposed may give a tile with a prefetch hint to `adjacent` (which then
  // ignores the hint); otherwise such a tile takes `rows`, which prefetches.
  static constexpr bool kAdjacentDropsPrefetch = false;
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void rows(int64_t kc, const float* const* arow, int64_t a_cs, const float* pack,
                                        int64_t ldp, int64_t vstride, typename Vec<W>::type (&acc)[MR][NR / W],
                                        const char* prefetch) {
    accumulate<MR, NR, W>(kc, arow, a_cs, pack, ldp, vstride, acc, prefetch);
  }
  template <int MR, int NR, int W>
  static ETFUSE_ALWAYS_INLINE void adjacent(int64_t kc, const float* a0, int64_t a_cs, const float* pack, int64_t ldp,
                                            int64_t vstride, typename Vec<W>::type (&acc)[MR][NR / W]) {
    accumulate_adjacent<MR, NR, W>(kc, a0, a_cs, pack, ldp, vstride, acc);
  }
};

// tile[MR][NR] = the sums of accumulate, for store_tile
template <int MR, int NR, int W, class Acc>
ETFUSE_ALWAYS_INLINE void micro(
    int64_t kc, const float* const* arow, int64_t a_cs, const float* pack, int64_t ldp, int64_t vstride,
    float (&tile)[MR][NR],
    const char* prefetch) {
  typename Vec<W>::type acc[MR][NR / W];
  Acc::template rows<MR, NR, W>(kc, arow, a_cs, pack, ldp, vstride, acc, prefetch);
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NR / W; ++v) store<W>(&tile[i][v * W], acc[i][v]);
}

// Whether micro_to_c can take a tile's K slice: rows of C (and of the residual) contiguous, scale
// and bias one per row or one per column (contiguous) or none; a full panel, or a last partial one
// where scale and bias are one per row or none (per column, their vectors would read past the end).
inline bool epilogue_in_registers(const Args& g, int64_t nr, int64_t NR) {
  const bool per_row = (!g.scale || g.scale_cs == 0) && (!g.bias || g.bias_cs == 0);
  return (nr == NR || per_row) && g.c_cs == 1 && (!g.residual || g.residual_cs == 1) &&
      (!g.scale || g.scale_cs == 0 || g.scale_cs == 1) && (!g.bias || g.bias_cs == 0 || g.bias_cs == 1);
}

// W values of a per-row (cs == 0: one value, broadcast) or per-column (cs == 1) epilogue operand.
template <int W>
ETFUSE_ALWAYS_INLINE typename Vec<W>::type epilogue_vector(const float* p, int64_t rs, int64_t cs, int64_t row,
                                                           int64_t col) {
  typename Vec<W>::type v;
  if (cs == 0) return v = typename Vec<W>::type{} + p[row * rs];
  std::memcpy(&v, p + row * rs + col, sizeof(v));
  return v;
}

// accumulate, then the epilogue (as store_tile: the scale on every slice, the bias on the first,
// C's partial sums added on the others, the clamp on the last) on the registers and straight
// into C: no round trip through the tile buffer, which cost as much as the multiply-adds at a
// short K (a 1x1 conv from 16 channels: K = 16), and a tenth of a long K's time (ViT's K = 768
// in three slices: store_tile's strided loops over C twice).
template <int MR, int NR, int W, class Acc>
ETFUSE_ALWAYS_INLINE void micro_to_c(const Args& g, int64_t kc, const float* const* arow, const float* pack,
                                     int64_t ldp, int64_t vstride, int64_t i0, int64_t j0, int64_t nr,
                                     const char* prefetch,
                                     bool first, bool last) {
  typedef typename Vec<W>::type vf;
  vf acc[MR][NR / W];
  Acc::template rows<MR, NR, W>(kc, arow, g.a_cs, pack, ldp, vstride, acc, prefetch);
  // Args copied to locals first (a store to C may alias them: each was reloaded per vector),
  // and a full panel's sums go from the registers straight to C (with the row's stores and the
  // partial panel's copy in one loop, the sums went through the stack): the epilogue was a third
  // of a K = 32 conv's instructions.
  const float *scale = g.scale, *bias = g.bias;
  const int64_t s_rs = g.scale_rs, s_cs = g.scale_cs, b_rs = g.bias_rs, b_cs = g.bias_cs, c_rs = g.c_rs;
  const bool clamp = g.clamp && last;
  const vf lo = vf{} + g.act_min, hi = vf{} + g.act_max;
  // `partial`: C's sums of the slices before (a K-sliced GEMM's later slices), or on the first
  // slice the residual's row
  const float* residual = first ? g.residual : nullptr;
  const int64_t r_rs = g.residual_rs;
  const bool add_partial = !first || residual, add_bias = first && bias;
  // always inlined: a call would pass the vector by the base ISA's ABI from an AVX2 / AVX-512
  // function (at -O0 it read garbage arguments: GCC's -Wpsabi warning, which the build silences)
  const auto epilogue = [&](vf x, const float* partial, int64_t row, int64_t col) __attribute__((always_inline)) {
    if (scale) x *= epilogue_vector<W>(scale, s_rs, s_cs, row, col);
    if (add_bias) x += epilogue_vector<W>(bias, b_rs, b_cs, row, col);
    if (add_partial) x += load<W>(partial);
    if (clamp) x = x < lo ? lo : (x > hi ? hi : x);  // clamp_act lane by lane (NaN kept)
    return x;
  };
  if (nr == NR) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* c = g.C + (i0 + i) * c_rs + j0;
      const float* from = residual ? residual + (i0 + i) * r_rs + j0 : c;
#pragma GCC unroll 4
      for (int v = 0; v < NR / W; ++v) store<W>(c + v * W, epilogue(acc[i][v], from + v * W, i0 + i, j0 + v * W));
    }
    return;
  }
  // a last partial panel (DS-CNN's 125 pixels: 7 panels and 13 columns)
  alignas(64) float row[NR];
  for (int i = 0; i < MR; ++i) {
    float* c = g.C + (i0 + i) * c_rs + j0;
    if (add_partial) std::memcpy(row, residual ? residual + (i0 + i) * r_rs + j0 : c, sizeof(float) * nr);
    for (int v = 0; v < NR / W; ++v) store<W>(row + v * W, epilogue(acc[i][v], row + v * W, i0 + i, j0 + v * W));
    std::memcpy(c, row, sizeof(float) * nr);
  }
}

// Whether micro_to_c_transposed can finish a tile: the whole K in one slice, a full panel, C's
// rows one float apart (conv2d's transposed problems, C(p, co) = out[co, p]), scale and bias one
// per column, contiguous, or none.
inline bool epilogue_transposed(const Args& g, int64_t nr, int64_t NR, bool first, bool last) {
  return first && last && (!g.residual || (g.residual_rs == 1 && g.residual_cs == g.c_cs)) && nr == NR &&
      g.c_rs == 1 && g.c_cs != 1 &&
      (!g.scale || (g.scale_rs == 0 && g.scale_cs == 1)) && (!g.bias || (g.bias_rs == 0 && g.bias_cs == 1));
}

// micro_to_c for the transposed problems: the epilogue on the registers (vectors along the
// columns, i.e. output channels), then each column of the tile written as one run of MR floats.
// store_tile's per-element epilogue with strided stores took as long as the multiply-adds
// there (a 128 -> 128 1x1 conv with batch norm on 6x6: 40% of the GEMM's time).
template <int MR, int NR, int W, class Acc>
ETFUSE_ALWAYS_INLINE void micro_to_c_transposed(const Args& g, int64_t kc, const float* const* arow,
                                                const float* pack, int64_t ldp, int64_t vstride, int64_t i0,
                                                int64_t j0,
                                                float (&tile)[MR][NR], const char* prefetch) {
  typedef typename Vec<W>::type vf;
  vf acc[MR][NR / W];
  if (g.a_rs == 1 && (!prefetch || Acc::kAdjacentDropsPrefetch)) {
    Acc::template adjacent<MR, NR, W>(kc, arow[0], g.a_cs, pack, ldp, vstride, acc);
  } else {
    Acc::template rows<MR, NR, W>(kc, arow, g.a_cs, pack, ldp, vstride, acc, prefetch);
  }
  const vf lo = vf{} + g.act_min, hi = vf{} + g.act_max;
  // A residual (laid out as C) is added to each column after the transpose, then the clamp.
  const bool clamp_sums = g.clamp && !g.residual;
  const float res_lo = g.clamp ? g.act_min : -__builtin_inff(), res_hi = g.clamp ? g.act_max : __builtin_inff();
  // Each column of the tile is MR contiguous floats of C. With MR <= W the tile's W columns of a
  // vector are transposed in registers (rows past MR zero) and each column copied as whole
  // vectors; element by element the columns took a fifth of a 64 -> 64 1x1 conv's time on 25x5
  // (DS-CNN).
  constexpr bool kTransposed = W >= 4 && MR <= W;
  alignas(64) float cols[kTransposed ? W : 1][kTransposed ? W : 1];
  for (int v = 0; v < NR / W; ++v) {
    vf sc, b;
    if (g.scale) std::memcpy(&sc, g.scale + j0 + v * W, sizeof(vf));
    if (g.bias) std::memcpy(&b, g.bias + j0 + v * W, sizeof(vf));
    vf t[kTransposed ? W : 1];
    for (int i = 0; i < MR; ++i) {
      vf x = acc[i][v];
      if (g.scale) x *= sc;
      if (g.bias) x += b;
      if (clamp_sums) x = x < lo ? lo : (x > hi ? hi : x);  // clamp_act lane by lane (NaN kept)
      if constexpr (kTransposed) {
        t[i] = x;
      } else {
        store<W>(&tile[i][v * W], x);
      }
    }
    if constexpr (kTransposed) {
      for (int i = MR; i < W; ++i) t[i] = vf{};
      transpose_block<W>(t);
      for (int j = 0; j < W; ++j) store<W>(cols[j], t[j]);
      for (int j = 0; j < W; ++j) {
        const int64_t at = i0 + (j0 + v * W + j) * g.c_cs;
        if (g.residual) {
          add_clamp_row<W>(g.C + at, cols[j], g.residual + at, MR, res_lo, res_hi);
        } else {
          copy_floats<MR>(g.C + at, cols[j]);
        }
      }
    }
  }
  if constexpr (kTransposed) return;
  for (int64_t j = 0; j < NR; ++j) {
    float* c = g.C + i0 + (j0 + j) * g.c_cs;
    for (int i = 0; i < MR; ++i) {
      c[i] = g.residual ? clamp_act(tile[i][j] + g.residual[i0 + (j0 + j) * g.c_cs + i], res_lo, res_hi) : tile[i][j];
    }
  }
}

// The epilogue through the tile buffer, for what micro_to_c and micro_to_c_transposed do not
// take: C or the residual strided along its rows, or a per-column scale or bias on a last partial
// panel. (One
// scale or bias per row with contiguous C always goes through micro_to_c now.)
template <int MR, int NR>
ETFUSE_ALWAYS_INLINE void store_tile(
    const Args& g, int64_t i0, int64_t j0, int64_t mr, int64_t nr, const float (&tile)[MR][NR], bool first,
    bool last) {
  const bool act = last && g.clamp;
  const float lo = g.act_min, hi = g.act_max;
  for (int64_t i = 0; i < mr; ++i) {
    float* c = g.C + (i0 + i) * g.c_rs + j0 * g.c_cs;
    const float* t = tile[i];
    // every K slice is scaled: sum(t_s) * s == sum(t_s * s)
    const float* sc = g.scale ? g.scale + (i0 + i) * g.scale_rs + j0 * g.scale_cs : nullptr;
    const float* bias = first && g.bias ? g.bias + (i0 + i) * g.bias_rs + j0 * g.bias_cs : nullptr;
    // what is added: C's partial sums, or on the first slice the residual (or nothing)
    const float* partial = !first ? c : g.residual ? g.residual + (i0 + i) * g.residual_rs + j0 * g.residual_cs : nullptr;
    const int64_t p_cs = !first ? g.c_cs : g.residual_cs;
    for (int64_t j = 0; j < nr; ++j) {
      float v = sc ? t[j] * sc[j * g.scale_cs] : t[j];
      if (bias) v += bias[j * g.bias_cs];
      if (partial) v += partial[j * p_cs];
      c[j * g.c_cs] = act ? clamp_act(v, lo, hi) : v;
    }
  }
}

// One tile of exactly mr (<= MR) rows: a short last row block (37 = 6 * 6 + 1 rows) computes
// its own rows only, not MR.
template <int MR, int NR, int W, class Acc>
ETFUSE_ALWAYS_INLINE void rows_tile(
    const Args& g, int64_t mr, int64_t i0, int64_t j0, int64_t nr, int64_t kc, const float* const* arow,
    const float* panel, int64_t ldp, int64_t vstride, float (&tile)[MR][NR], bool first, bool last,
    const char* prefetch) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      float(&fewer)[MR - 1][NR] = *reinterpret_cast<float(*)[MR - 1][NR]>(&tile[0][0]);
      rows_tile<MR - 1, NR, W, Acc>(g, mr, i0, j0, nr, kc, arow, panel, ldp, vstride, fewer, first, last, prefetch);
      return;
    }
  }
  if (epilogue_in_registers(g, nr, NR)) {
    micro_to_c<MR, NR, W, Acc>(g, kc, arow, panel, ldp, vstride, i0, j0, nr, prefetch, first, last);
    return;
  }
  if (epilogue_transposed(g, nr, NR, first, last)) {
    micro_to_c_transposed<MR, NR, W, Acc>(g, kc, arow, panel, ldp, vstride, i0, j0, tile, prefetch);
    return;
  }
  micro<MR, NR, W, Acc>(kc, arow, g.a_cs, panel, ldp, vstride, tile, prefetch);
  store_tile<MR, NR>(g, i0, j0, mr, nr, tile, first, last);
}

// Tasks per column group in the rows-outer order (run()): the panels are cut into
// kColumnGroups groups, each walked row block by row block, so that a parallel_for's equal
// contiguous chunks get equal work. Walking all the panels of one row block after another, a
// 32-row 1x1 conv cut into row blocks of 24 and 8 gave one thread of two 3x the other's work
// (MobileNetV1's 32 -> 32 on 24x24: 20 us on two threads, as on one).
constexpr int64_t kColumnGroups = 2;

inline int64_t group_panels(int64_t panels) { return (panels + kColumnGroups - 1) / kColumnGroups; }

// Tiles [t0, t1): tile t is column panel t / mblocks, row block t % mblocks (mc rows, a multiple of MR),
// or with `rows_outer` column group t / (mblocks * gp), then row block, then panel within the
// group (gp = group_panels; a chunk of tasks then walks along a few rows of C: a few long write
// streams instead of mc short ones; a task past the last panel is empty).
template <int MR, int NR, int W, class Acc = PortableAccumulate>
ETFUSE_ALWAYS_INLINE void tiles_impl(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  const int64_t panels = (g.N + NR - 1) / NR;
  const bool rows_outer = mblocks < 0;  // run() passes -mblocks for that order
  if (rows_outer) mblocks = -mblocks;
  const int64_t gp = group_panels(panels);
  alignas(64) float stack_pack[kKC * NR];
  alignas(64) float tile[MR][NR];
  // Prefetch a prepacked B that will not sit in this core's L2 (a weight that does is read from
  // cache anyway: there the extra load per k step cost 4-8% on 1x1 convs of 128-512 channels).
  const bool prefetch_b = g.packed_b && NR == kPanel && g.K * g.N * int64_t(sizeof(float)) >= kPrefetchMinBytes;
  // K in equal slices of at most kKC (K = 288 is 2 x 144, not 256 + a 32-long tail pass over C).
  // A transposed problem with a prepacked B (conv2d's run_packed: C's rows one float apart) takes
  // its whole K in one slice: its epilogue then stays on the registers (micro_to_c_transposed
  // takes only a whole K), where every slice went through store_tile's strided loops over C.
  // One thread, us (slices of 256 -> whole K): SqueezeNet's 64 -> 256 3x3 on 5x5 (K = 576) 84 ->
  // 65, 512 -> 1000 1x1 on 5x5 334 -> 196, MobileNetV2's 384 -> 64 on 12x12 91 -> 43-61.
  const bool whole_k = g.packed_b && g.c_rs == 1 && g.c_cs != 1;
  const int64_t nslices = whole_k ? 1 : (g.K + kKC - 1) / kKC;
  const int64_t kstep = whole_k ? std::max(g.K, kKC) : nslices > 1 ? (g.K + nslices - 1) / nslices : kKC;
  // the panels copied out of the prepacked ones (copy_packed: a last odd 16-wide panel on AVX-512)
  thread_local std::vector<float> long_pack;
  float* const pack = kstep > kKC ? aligned_floats(long_pack, static_cast<size_t>(kstep * NR)) : stack_pack;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t panel = t / mblocks, block = t % mblocks;
    if (rows_outer) {
      const int64_t in_group = t % (mblocks * gp);
      panel = t / (mblocks * gp) * gp + in_group % gp;
      block = in_group / gp;
      if (panel >= panels) continue;
    }
    const int64_t j0 = panel * NR;
    const int64_t nr = (g.N - j0) < NR ? (g.N - j0) : NR;
    const int64_t ib = block * mc;
    const int64_t ie = (ib + mc) < g.M ? (ib + mc) : g.M;
    for (int64_t k0 = 0;; k0 += kstep) {
      const int64_t kc = (g.K - k0) < kstep ? (g.K - k0) : kstep;
      const bool first = k0 == 0, last = k0 + kc >= g.K;
      const float* panel = pack;
      int64_t ldp = NR, vstride = W;
      if (g.packed_b_i8) {
        copy_packed<NR>(g, g.packed_b_i8, k0, kc, j0, pack);
      } else if (g.packed_b && NR == kPanel) {
        panel = g.packed_b + (j0 / kPanel) * g.K * kPanel + k0 * kPanel;  // in place
      } else if (g.packed_b && W == kPanel && NR == 2 * kPanel && j0 / kPanel + 1 < packed_panels(g.N)) {
        // the AVX-512 tile's two vectors, each from its own panel, in place (a copy of the two
        // cost a tenth of the multiply-adds at 16 rows)
        panel = g.packed_b + (j0 / kPanel) * g.K * kPanel + k0 * kPanel;
        ldp = kPanel;
        vstride = g.K * kPanel;
      } else if (g.b_direct && nr == NR) {
        panel = g.B + k0 * g.b_rs + j0;  // in place: rows of B are contiguous
        ldp = g.b_rs;
      } else if (g.packed_b) {
        copy_packed<NR>(g, g.packed_b, k0, kc, j0, pack);
      } else if (g.pack) {
        g.pack(g.pack_ctx, k0, kc, j0, nr, NR, pack);
      } else {
        pack_b<NR>(g, k0, kc, j0, nr, pack);
      }
      // The block's rows in tiles of near-equal height (37 rows: 6 6 5 5 5 5 5, not 6 x 6 + 1): a
      // tile of one or two rows keeps too few sums to hide the multiply-add latency, so its K
      // loop ran at the speed of a 5-row tile (ViT's 37-token linears: 544 -> 490 us at 36 rows).
      const int64_t ntiles = (ie - ib + MR - 1) / MR, base = (ie - ib) / ntiles, taller = (ie - ib) % ntiles;
      int64_t i0 = ib;
      for (int64_t tile_index = 0; tile_index < ntiles; ++tile_index) {
        const int64_t mr = base + (tile_index < taller ? 1 : 0);
        const float* arow[MR];
        for (int i = 0; i < mr; ++i) arow[i] = g.A + (i0 + i) * g.a_rs + k0 * g.a_cs;
        // A prepacked weight is one stream read in order (slice after slice, panel after panel)
        // and usually from DRAM (ViT-B's 340 MB): while the rows after the first compute on this
        // slice, each tile prefetches the next slice, one cache line (one k row) per k step. The
        // first tile is left to wait on its own loads (past the last panel the prefetch reads
        // nothing: prefetches do not fault). ViT-B/16 at 96x96 57.5 -> 48 ms, the
        // example llama's 16-token prefill 2.6 -> 2.25 ms (2 threads).
        const char* prefetch = nullptr;
        if (prefetch_b && (tile_index > 0 || ntiles == 1))
          prefetch = reinterpret_cast<const char*>(panel + kc * kPanel);
        rows_tile<MR, NR, W, Acc>(g, mr, i0, j0, nr, kc, arow, panel, ldp, vstride, tile, first, last, prefetch);
        i0 += mr;
      }
      if (last) break;
    }
  }
}

struct Kernel {
  int mr, nr;
  void (*tiles)(const Args&, int64_t, int64_t, int64_t, int64_t);
};

// A few rows (a decoding step's one token) on a prepacked B: the tiles would run one- or
// two-row MR-row tiles, whose 2-4 sums per k step wait on each other's multiply-add latency
// (1024 x 1024 at one row: 229 us, the unpacked dot path 204). Here each panel is one contiguous
// [K][16] stream read once for all R rows, with U k steps in flight, each into its own sums
// (U * R * 16 / W independent vectors, about 8), added at the end: the core of
// core/int8_gemm.h's panels_rows on float panels. Rows may have any strides, C too.
constexpr int64_t kPackedFewRows = 2;

inline bool use_packed_rows(const Args& g) {
  return g.packed_b != nullptr && g.M <= kPackedFewRows && g.K > 0 && g.pack == nullptr;
}

// C's columns [j0, j0 + cols) of row i from the panel's 16 sums, through the epilogue.
ETFUSE_ALWAYS_INLINE void store_packed_row(const Args& g, int64_t i, int64_t j0, int64_t cols, const float* sums) {
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t j = j0 + c;
    float v = sums[c];
    if (g.scale) v *= g.scale[i * g.scale_rs + j * g.scale_cs];
    if (g.bias) v += g.bias[i * g.bias_rs + j * g.bias_cs];
    if (g.residual) v += g.residual[i * g.residual_rs + j * g.residual_cs];
    g.C[i * g.c_rs + j * g.c_cs] = g.clamp ? clamp_act(v, g.act_min, g.act_max) : v;
  }
}

// Rows [i0, i0 + R) x panels [p0, p1), W-wide vectors (portable code: the baseline, AVX2 and
// AVX-512 copies).
// Prefetch: a weight that does not sit in L2 (kPrefetchMinBytes), kPackedPrefetchRows k rows ahead.
constexpr int64_t kPackedPrefetchRows = 64;

template <int W, int R, bool Prefetch>
ETFUSE_ALWAYS_INLINE void packed_rows_block(const Args& g, int64_t i0, int64_t p0, int64_t p1) {
  typedef typename Vec<W>::type vf;
  constexpr int NV = kPanel / W;
  constexpr int U = 8 / (R * NV) > 0 ? 8 / (R * NV) : 1;  // k steps in flight
  const float* a[R];
  for (int r = 0; r < R; ++r) a[r] = g.A + (i0 + r) * g.a_rs;
  const int64_t a_cs = g.a_cs;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = g.packed_b + p * g.K * kPanel;
    vf acc[U][R][NV];
    for (int u = 0; u < U; ++u)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[u][r][v] = vf{};
    int64_t k = 0;
    for (; k + U <= g.K; k += U) {
      for (int u = 0; u < U; ++u) {
        if (Prefetch) __builtin_prefetch(panel + (k + u + kPackedPrefetchRows) * kPanel, 0, 0);
        vf bv[NV];
        for (int v = 0; v < NV; ++v) bv[v] = load<W>(panel + (k + u) * kPanel + v * W);
        for (int r = 0; r < R; ++r) {
          const float s = a[r][(k + u) * a_cs];
          for (int v = 0; v < NV; ++v) acc[u][r][v] += s * bv[v];
        }
      }
    }
    for (; k < g.K; ++k) {
      vf bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = load<W>(panel + k * kPanel + v * W);
      for (int r = 0; r < R; ++r) {
        const float s = a[r][k * a_cs];
        for (int v = 0; v < NV; ++v) acc[0][r][v] += s * bv[v];
      }
    }
    const int64_t j0 = p * kPanel, cols = (g.N - j0) < kPanel ? (g.N - j0) : kPanel;
    for (int r = 0; r < R; ++r) {
      alignas(64) float sums[kPanel];
      for (int v = 0; v < NV; ++v) {
        vf t = acc[0][r][v];
        for (int u = 1; u < U; ++u) t += acc[u][r][v];
        store<W>(sums + v * W, t);
      }
      store_packed_row(g, i0 + r, j0, cols, sums);
    }
  }
}

// Every row (M <= kPackedFewRows) x panels [p0, p1): rows in pairs, an odd last one alone.
template <int W>
ETFUSE_ALWAYS_INLINE void packed_rows_impl(const Args& g, int64_t p0, int64_t p1) {
  const bool prefetch = g.K * g.N * int64_t(sizeof(float)) >= kPrefetchMinBytes;
  int64_t i = 0;
  for (; i + 2 <= g.M; i += 2)
    prefetch ? packed_rows_block<W, 2, true>(g, i, p0, p1) : packed_rows_block<W, 2, false>(g, i, p0, p1);
  if (i < g.M) prefetch ? packed_rows_block<W, 1, true>(g, i, p0, p1) : packed_rows_block<W, 1, false>(g, i, p0, p1);
}

}  // namespace detail
}  // namespace gemm
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/gemm_neon.h"
#endif

namespace etfuse {
namespace core {
namespace gemm {
namespace detail {

// Compiled once per library in core/kernels.cpp.
void tiles_baseline(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void tiles_avx2(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc);
ETFUSE_TARGET_AVX512 void tiles_avx512(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc);
#endif
#if ETFUSE_HAVE_ARM_NEON
void tiles_neon(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void tiles_baseline(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  tiles_impl<4, 8, 4>(g, t0, t1, mblocks, mc);
}
#if ETFUSE_HAVE_ARM_NEON
// 4 x 16: 16 of the 32 vector registers hold sums, 4 hold A's values, 4 B's; NR
// = kPanel reads a prepacked weight in place.
void tiles_neon(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  if (arm::use_packed_a(g, mblocks)) {
    arm::tiles_packed_a(g, t0, t1, mblocks, mc);
    return;
  }
  tiles_impl<4, 16, 4, arm::NeonAccumulate>(g, t0, t1, mblocks, mc);
}
#endif
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void tiles_avx2(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  tiles_impl<6, 16, 8>(g, t0, t1, mblocks, mc);
}
ETFUSE_TARGET_AVX512 void tiles_avx512(const Args& g, int64_t t0, int64_t t1, int64_t mblocks, int64_t mc) {
  tiles_impl<12, 32, 16>(g, t0, t1, mblocks, mc);
}
#endif
#endif

// Few rows, with A's rows and B's columns both contiguous along k (linear's [N, K] weight; a
// conv on a small map as its transposed im2col times the [Cout, K] weight): packing B would copy
// the whole weight to use each element M times, so these run as dot products instead. Blocks of
// 2 rows x 4 columns keep 8 sums in registers (6 loads per 8 multiply-adds; an odd last row runs
// 1 x 4); each block of 4 weight columns stays in L1 while every row passes over it, so the
// weight is read once.
// Up to 4 rows always; up to 16 when K is long enough for the 8 horizontal sums per block to
// be cheap next to its K / W vector steps (measured on AVX2: 8x512x512 1.4x the tiles, 16x64x256
// 0.6x).
constexpr int64_t kDotMaxRows = 16, kDotFewRows = 4, kDotMinK = 256;

inline bool use_dot(const Args& g) {
  return (g.dot || g.M <= kDotFewRows || (g.M <= kDotMaxRows && g.K >= kDotMinK)) && g.pack == nullptr &&
      g.packed_b == nullptr && g.packed_b_i8 == nullptr &&
      g.b_rs == 1 && g.a_cs == 1 && g.K > 0;
}

// The sum of a vector's lanes as a tree of halves: a loop over the lanes is W dependent scalar
// adds (64 cycles of latency at 16 lanes), a third of a 288-deep 4-bit dot product's time.
template <int W>
ETFUSE_ALWAYS_INLINE float hsum(const typename Vec<W>::type& v) {
  if constexpr (W > 4) {
    typedef typename Vec<W / 2>::type half;
    half lo, hi;
    std::memcpy(&lo, &v, sizeof(half));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(half), sizeof(half));
    return hsum<W / 2>(lo + hi);
  } else {
    return (v[0] + v[2]) + (v[1] + v[3]);
  }
}

// Rows [i, i + R) x columns [j, j + nj) (nj <= 4; b[c] for c >= nj repeats a valid column).
template <int W, int R>
ETFUSE_ALWAYS_INLINE void dot_block(const Args& g, int64_t i, int64_t j, int64_t nj, const float* const* b) {
  typedef typename Vec<W>::type vf;
  const float* a[R];
  for (int r = 0; r < R; ++r) a[r] = g.A + (i + r) * g.a_rs;
  vf acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = vf{};
  int64_t k = 0;
  for (; k + W <= g.K; k += W) {
    vf av[R];
    for (int r = 0; r < R; ++r) std::memcpy(&av[r], a[r] + k, sizeof(vf));
    for (int c = 0; c < 4; ++c) {
      vf bv;
      std::memcpy(&bv, b[c] + k, sizeof(vf));
      for (int r = 0; r < R; ++r) acc[r][c] += av[r] * bv;
    }
  }
  const bool act = g.clamp;
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < nj; ++c) {
      float sum = hsum<W>(acc[r][c]);
      for (int64_t kk = k; kk < g.K; ++kk) sum += a[r][kk] * b[c][kk];
      const int64_t ii = i + r, jj = j + c;
      if (g.scale) sum *= g.scale[ii * g.scale_rs + jj * g.scale_cs];
      if (g.bias) sum += g.bias[ii * g.bias_rs + jj * g.bias_cs];
      if (g.residual) sum += g.residual[ii * g.residual_rs + jj * g.residual_cs];
      g.C[ii * g.c_rs + jj * g.c_cs] = act ? clamp_act(sum, g.act_min, g.act_max) : sum;
    }
  }
}

template <int W>
ETFUSE_ALWAYS_INLINE void dot_cols_impl(const Args& g, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += 4) {
    const int64_t nj = (j1 - j) < 4 ? (j1 - j) : 4;
    const float* b[4];
    for (int c = 0; c < 4; ++c) b[c] = g.B + (j + (c < nj ? c : 0)) * g.b_cs;
    int64_t i = 0;
    for (; i + 2 <= g.M; i += 2) dot_block<W, 2>(g, i, j, nj, b);
    if (i < g.M) dot_block<W, 1>(g, i, j, nj, b);
  }
}

// Compiled once per library in core/kernels.cpp.
void dot_cols_baseline(const Args& g, int64_t j0, int64_t j1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void dot_cols_avx2(const Args& g, int64_t j0, int64_t j1);
ETFUSE_TARGET_AVX512 void dot_cols_avx512(const Args& g, int64_t j0, int64_t j1);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void dot_cols_baseline(const Args& g, int64_t j0, int64_t j1) {
  dot_cols_impl<4>(g, j0, j1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void dot_cols_avx2(const Args& g, int64_t j0, int64_t j1) {
  dot_cols_impl<8>(g, j0, j1);
}
ETFUSE_TARGET_AVX512 void dot_cols_avx512(const Args& g, int64_t j0, int64_t j1) {
  dot_cols_impl<16>(g, j0, j1);
}
#endif
#endif

// Compiled once per library in core/kernels.cpp.
void packed_rows_baseline(const Args& g, int64_t p0, int64_t p1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void packed_rows_avx2(const Args& g, int64_t p0, int64_t p1);
ETFUSE_TARGET_AVX512 void packed_rows_avx512(const Args& g, int64_t p0, int64_t p1);
#endif
#if ETFUSE_HAVE_ARM_NEON
void packed_rows_neon(const Args& g, int64_t p0, int64_t p1);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void packed_rows_baseline(const Args& g, int64_t p0, int64_t p1) {
  packed_rows_impl<4>(g, p0, p1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void packed_rows_avx2(const Args& g, int64_t p0, int64_t p1) {
  packed_rows_impl<8>(g, p0, p1);
}
ETFUSE_TARGET_AVX512 void packed_rows_avx512(const Args& g, int64_t p0, int64_t p1) {
  packed_rows_impl<16>(g, p0, p1);
}
#endif
#if ETFUSE_HAVE_ARM_NEON
void packed_rows_neon(const Args& g, int64_t p0, int64_t p1) {
  arm::packed_rows_neon_impl(g, p0, p1);
}
#endif
#endif

// The GEMM's kernels on one ISA: the one place they are chosen.
struct Kernels {
  Kernel tiles;
  void (*dot_cols)(const Args&, int64_t, int64_t);  // the GEMV-like problems (use_dot)
  void (*packed_rows)(const Args&, int64_t, int64_t);  // a few rows on a prepacked B (use_packed_rows), panels [p0, p1)
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512: return {{12, 32, &tiles_avx512}, &dot_cols_avx512, &packed_rows_avx512};
    case Isa::kAvx2: return {{6, 16, &tiles_avx2}, &dot_cols_avx2, &packed_rows_avx2};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {{4, 16, &tiles_neon}, &dot_cols_baseline, &packed_rows_neon};
#endif
    default: return {{4, 8, &tiles_baseline}, &dot_cols_baseline, &packed_rows_baseline};
  }
}

}  // namespace detail

// Runs the GEMM described by `g` (validated by the caller).
template <class Par>
inline void run(const Args& g, Par&& par) {
  if (g.M <= 0 || g.N <= 0) return;
  if (detail::use_dot(g)) {
    const auto dot = detail::kernels(selected_isa()).dot_cols;
    // column blocks of ~256 KFLOP, a multiple of 4 columns, each column's weight read costed as
    // 8 rows' multiply-adds: a decoding step's GEMV (M = 1) streams its weight at about 2 flops
    // per byte, so its columns split across threads from 288 x 288 on, not from 288 x 576
    int64_t grain = ((int64_t(1) << 18) / (2 * g.K * (g.M + 8)) + 3) / 4 * 4;
    if (grain < 4) grain = 4;
    if (g.N <= grain) {
      dot(g, 0, g.N);
    } else {
      par(0, g.N, grain, [&](int64_t begin, int64_t end) { dot(g, begin, end); });
    }
    return;
  }
  if (detail::use_packed_rows(g)) {
    const auto rows = detail::kernels(selected_isa()).packed_rows;
    // blocks of panels of ~256 KFLOP, each panel's weight read costed as 8 rows' multiply-adds
    // (use_dot's grain in panels)
    int64_t grain = (int64_t(1) << 18) / (2 * g.K * (g.M + 8) * kPanel);
    if (grain < 1) grain = 1;
    const int64_t panels = packed_panels(g.N);
    if (panels <= grain) {
      rows(g, 0, panels);
    } else {
      par(0, panels, grain, [&](int64_t begin, int64_t end) { rows(g, begin, end); });
    }
    return;
  }
  const detail::Kernel kern = detail::kernels(selected_isa()).tiles;
  const int64_t panels = (g.N + kern.nr - 1) / kern.nr;
  // Row blocks of kMC rows; fewer rows per block when that leaves under kMinTasks tiles (a
  // 64-channel conv on a 6x6 map is 3 panels x 1 block: 2 of 3 on one thread of 2). Each extra
  // block repacks its B panels: K * NR floats per MR * K * NR multiply-adds or more.
  int64_t mc = detail::kMC;
  // B read in place and a short K (a 1x1 conv from few channels, MobileNetV2's 16 -> 96 on 48x48):
  // the time goes into writing C, so row blocks of a few tiles, each walked along its rows.
  const bool rows_outer = g.b_direct && g.K <= detail::kRowsOuterMaxK;
  if (rows_outer) mc = detail::kRowsOuterMC / kern.mr * kern.mr;
  if (!rows_outer && panels * ((g.M + mc - 1) / mc) < detail::kMinTasks) {
    const int64_t want = (detail::kMinTasks + panels - 1) / panels;
    mc = ((g.M + want - 1) / want + kern.mr - 1) / kern.mr * kern.mr;
    if (mc > detail::kMC) mc = detail::kMC;
  }
  const int64_t mblocks = (g.M + mc - 1) / mc;
  const int64_t tasks = (rows_outer ? detail::kColumnGroups * detail::group_panels(panels) : panels) * mblocks;
  // About 256 KFLOP per parallel chunk (1 MFLOP kept DS-CNN's 1 MFLOP pointwise convs on one
  // thread: 47 -> 27 us on two; a thread wake-up costs a few microseconds).
  const int64_t rows = g.M < mc ? g.M : mc;
  const int64_t flops_per_task = 2 * rows * (g.K > 0 ? g.K : 1) * kern.nr;
  int64_t grain = (int64_t(1) << 18) / flops_per_task;
  if (grain < 1) grain = 1;
  const int64_t order = rows_outer ? -mblocks : mblocks;  // tiles_impl's convention
  if (tasks <= grain || g.M * g.N * g.K + kMacsPerElement * g.K * (g.M + g.N) < kParallelMinMacs) {
    kern.tiles(g, 0, tasks, order, mc);
    return;
  }
  par(0, tasks, grain, [&](int64_t begin, int64_t end) { kern.tiles(g, begin, end, order, mc); });
}

}  // namespace gemm
}  // namespace core
}  // namespace etfuse
