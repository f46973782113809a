// An int8 1x1 convolution (pointwise, groups 1, stride 1, no padding; a spatial one over its
// im2col, below). On aarch64: arch/arm/int8_neon.h (sdot, or smlal without dot products);
// `conv` and `available` choose. On AVX-512 VNNI: 8-bit
// activations times int8 weights summed in int32 by vpdpbusd (64 multiply-adds an instruction,
// 4 times the float32 FMA's 16), requantized in the same pass.
//
//   acc[c, p] = sum_k w[c, k] * (x[k, p] - x_zp)            exact, in int32
//   out[c, p] = clamp(rint((float(acc) * scale[c] + bias[c]) * inv) + zp, lo, hi)
//
// vpdpbusd multiplies unsigned by signed bytes, 4 k at a time per int32 lane. The activations
// are the unsigned side: uint8 as they are, int8 shifted by 128 (x ^ 0x80), so
//   sum_k w * (x - x_zp) = dpbusd(x_u8, w) - (x_zp + shift) * sum_k w[c, k]
// and the accumulators start at the second term. The weight zero points must be 0 (the
// XNNPACK quantizer's symmetric per-channel weights); callers keep the float path otherwise.
//
// Layout: the input [K][P] (NCHW, one image) is interleaved per 48-pixel tile into
// [K/4][48][4] bytes, so one 64-byte load holds 4 k of 16 pixels; each output channel's 4 k are
// one broadcast int32 of the weight row [C][K]. An 8-channel x 48-pixel tile keeps 24
// accumulators in registers. The epilogue is int8_epilogue.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "int8_epilogue.h"

namespace etfuse {
namespace core {
namespace int8_pointwise {

struct Problem {
  const uint8_t* x = nullptr;  // the input's bytes [N][K][P], contiguous
  bool x_signed = true;        // int8 (shifted by 128) or uint8
  int32_t x_zero_point = 0;
  // The weight, zero-padded to K4 (K rounded up to 4) and C16 (C rounded up to 16), either as
  // rows [C][K4] or, with `quads`, as 16-channel panels of 4-k groups [C16 / 16][K4 / 4][16][4]
  // (to_quads: from the packed ops' GEMM panels).
  // What `conv` takes: rows [C][K] (no padding) or, with `panels`, the packed ops' GEMM panels
  // [C16 / 16][K][16]; it lays them out for its kernel.
  const int8_t* w = nullptr;
  bool quads = false;
  bool panels = false;
  int64_t N = 0, K = 0, C = 0, P = 0;
  int8_epilogue::Requant requant;
  uint8_t* out = nullptr;  // [N][C][P] bytes, contiguous; int8 when x_signed
};

constexpr int64_t kTilePixels = 48;  // 3 vectors of 16
constexpr int kRows = 8;             // output channels per tile

inline int64_t k_padded(int64_t K) { return (K + 3) / 4 * 4; }

// Where channel c's 4 weights of k-group 0 are, and the step to the next group.
inline const int8_t* weight_of(const Problem& pb, int64_t c) {
  const int64_t K4 = k_padded(pb.K);
  return pb.quads ? pb.w + (c / 16) * K4 * 16 + (c % 16) * 4 : pb.w + c * K4;
}
inline int64_t weight_step(const Problem& pb) { return pb.quads ? 64 : 4; }

// Everything below up to the ARM section is x86 (AVX-512 VNNI).
#if ETFUSE_HAVE_X86_DISPATCH
// On where the ISA includes AVX-512 VNNI (core/isa.h).
inline bool available() { return isa_at_least(Isa::kAvx512Vnni); }

// Four rows of 16 bytes r[j][i] -> 16 groups of 4, dst[4 * i + j] (SSE2 unpacks): 4 k of 16
// pixels (interleave) or of 16 channels (to_quads).
ETFUSE_ALWAYS_INLINE void zip4(const __m128i (&r)[4], void* dst) {
  const __m128i a = _mm_unpacklo_epi8(r[0], r[1]), b = _mm_unpackhi_epi8(r[0], r[1]);
  const __m128i c = _mm_unpacklo_epi8(r[2], r[3]), d = _mm_unpackhi_epi8(r[2], r[3]);
  __m128i* out = static_cast<__m128i*>(dst);
  _mm_storeu_si128(out, _mm_unpacklo_epi16(a, c));
  _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(a, c));
  _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(b, d));
  _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(b, d));
}

namespace detail {

// One task's share: pixel tile t of image n over output channels [c_begin, c_end).
// Compiled once per library in core/kernels.cpp.
ETFUSE_TARGET_VNNI void run_tile(const Problem& pb, const int32_t* wsum, int64_t n, int64_t t, int64_t c_begin,
                                 int64_t c_end);
ETFUSE_TARGET_VNNI void weight_sums(const Problem& pb, int32_t* sums);

#if defined(ETFUSE_CORE_KERNELS)
// x[k, p0 .. p0 + 48) for k in [0, K4) -> xq[K4 / 4][48][4], unsigned; pixels past P and rows
// past K read as 0 (the padded weights are 0 there, and the pixels are not stored).
// Only the tile's nv vectors are filled (a 3x3 map has 9 pixels: one).
ETFUSE_TARGET_VNNI ETFUSE_ALWAYS_INLINE void interleave(const Problem& pb, const uint8_t* x, int64_t p0, int nv,
                                                        const __mmask16* masks, uint8_t* xq) {
  const int64_t K4 = k_padded(pb.K);
  const __m128i flip = _mm_set1_epi8(pb.x_signed ? static_cast<char>(0x80) : 0);
  for (int64_t k = 0; k < K4; k += 4) {
    for (int v = 0; v < nv; ++v) {
      __m128i r[4];
      for (int j = 0; j < 4; ++j) {
        r[j] = k + j < pb.K ? _mm_maskz_loadu_epi8(masks[v], x + (k + j) * pb.P + p0 + 16 * v) : _mm_setzero_si128();
        r[j] = _mm_xor_si128(r[j], flip);
      }
      zip4(r, xq + (k * kTilePixels + 64 * v));
    }
  }
}

// Output channels [c0, c0 + rows) x the tile's NV vectors of 16 pixels.
template <int NV>
ETFUSE_TARGET_VNNI ETFUSE_ALWAYS_INLINE void tile(const Problem& pb, const int32_t* wsum, const uint8_t* xq,
                                                  int64_t c0, int rows, const __mmask16* masks, uint8_t* out) {
  const int64_t K4 = k_padded(pb.K), step = weight_step(pb);
  const int8_t* w[kRows];
  __m512i acc[kRows][NV];
  const int32_t shift = pb.x_zero_point + (pb.x_signed ? 128 : 0);
  for (int m = 0; m < kRows; ++m) {
    const int64_t c = c0 + (m < rows ? m : 0);  // rows past C repeat a channel and are not stored
    w[m] = weight_of(pb, c);
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_set1_epi32(-shift * wsum[c]);
  }
  for (int64_t k = 0, at = 0; k < K4; k += 4, at += step) {
    __m512i xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = _mm512_loadu_si512(xq + k * kTilePixels + 64 * v);
    for (int m = 0; m < kRows; ++m) {
      int32_t word;
      std::memcpy(&word, w[m] + at, 4);
      const __m512i wv = _mm512_set1_epi32(word);
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbusd_epi32(acc[m][v], xv[v], wv);
    }
  }
  for (int m = 0; m < rows; ++m)
    for (int v = 0; v < NV; ++v) {
      int8_epilogue::store16(pb.requant, _mm512_cvtepi32_ps(acc[m][v]), c0 + m, masks[v], out + (c0 + m) * pb.P + 16 * v);
    }
}

ETFUSE_TARGET_VNNI void run_tile(const Problem& pb, const int32_t* wsum, int64_t n, int64_t t, int64_t c_begin,
                                 int64_t c_end) {
  thread_local std::vector<uint8_t> xq;
  const int64_t K4 = k_padded(pb.K);
  if (static_cast<int64_t>(xq.size()) < K4 * kTilePixels) xq.resize(static_cast<size_t>(K4 * kTilePixels));
  const uint8_t* x = pb.x + n * pb.K * pb.P;
  uint8_t* out = pb.out + n * pb.C * pb.P;
  const int64_t p0 = t * kTilePixels, left = std::min(kTilePixels, pb.P - p0);
  __mmask16 masks[3];
  for (int v = 0; v < 3; ++v) {
    const int64_t m = std::max<int64_t>(0, std::min<int64_t>(16, left - 16 * v));
    masks[v] = static_cast<__mmask16>((1u << m) - 1u);
  }
  const int nv = static_cast<int>((left + 15) / 16);
  interleave(pb, x, p0, nv, masks, xq.data());
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, c_end - c0));
    if (nv == 3) {
      tile<3>(pb, wsum, xq.data(), c0, rows, masks, out + p0);
    } else if (nv == 2) {
      tile<2>(pb, wsum, xq.data(), c0, rows, masks, out + p0);
    } else {
      tile<1>(pb, wsum, xq.data(), c0, rows, masks, out + p0);
    }
  }
}

ETFUSE_TARGET_VNNI void weight_sums(const Problem& pb, int32_t* sums) {
  const int64_t K4 = k_padded(pb.K);
  const __m512i ones = _mm512_set1_epi8(1);
  if (pb.quads) {  // 16 channels at a time: one dpbusd per 4-k group sums its 4 values per lane
    for (int64_t c0 = 0; c0 < pb.C; c0 += 16) {
      const int8_t* panel = pb.w + c0 * K4;
      __m512i s = _mm512_setzero_si512();
      for (int64_t k = 0; k < K4; k += 4) s = _mm512_dpbusd_epi32(s, ones, _mm512_loadu_si512(panel + k * 16));
      alignas(64) int32_t lanes[16];
      _mm512_store_si512(lanes, s);
      for (int64_t c = c0; c < std::min(pb.C, c0 + 16); ++c) sums[c] = lanes[c - c0];
    }
    return;
  }
  for (int64_t c = 0; c < pb.C; ++c) {
    const int8_t* row = pb.w + c * K4;
    __m512i s = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 64 <= K4; k += 64) s = _mm512_dpbusd_epi32(s, ones, _mm512_loadu_si512(row + k));
    int32_t total = _mm512_reduce_add_epi32(s);
    for (; k < K4; ++k) total += row[k];
    sums[c] = total;
  }
}
#endif

}  // namespace detail

// A spatial int8 conv (groups 1) runs as this 1x1 conv over its im2col: row k = (c, kh, kw) of
// [K][OH * OW] bytes holds the input pixel each output reads at that tap, the padding as the
// input's zero point (so x - x_zp is 0 there). One image; `pad` is the zero point's byte.
using int8_epilogue::Geometry;

namespace detail {
ETFUSE_TARGET_VNNI void strided_row(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride);
#if defined(ETFUSE_CORE_KERNELS)
// im2col's strided rows on AVX-512BW: stride 2 as the even bytes of 2 * 16, one narrowing move per
// 16 outputs (the last output reads byte 2 * (n - 1): inside the padded row).
ETFUSE_TARGET_VNNI void strided_row(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride) {
  if (stride != 2) return int8_epilogue::strided_bytes(dst, src, n, stride);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
    const __m256i v = _mm256_maskz_loadu_epi16(lanes, src + 2 * i);
    _mm_mask_storeu_epi8(dst + i, lanes, _mm256_cvtepi16_epi8(v));
  }
}
#endif
}  // namespace detail

// The packed ops' GEMM panels [C16 / 16][K][16] (pack_gemm_weight) -> quads (Problem::w):
// each 4 x 16 block of 4 k by 16 channels becomes 16 x 4, zero rows past K. Panels [p0, p1)
// of `out`, which holds C16 * K4 bytes.
inline void to_quads(const int8_t* panels, int64_t K, int64_t p0, int64_t p1, int8_t* out) {
  const int64_t K4 = k_padded(K);
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* panel = panels + p * K * 16;
    for (int64_t k = 0; k < K4; k += 4) {
      __m128i r[4];
      for (int j = 0; j < 4; ++j) {
        r[j] = k + j < K ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + (k + j) * 16)) : _mm_setzero_si128();
      }
      zip4(r, out + (p * K4 + k) * 16);
    }
  }
}

// The whole conv; `par` a parallel_for. Tasks are 48-pixel tiles (each interleaves its own
// pixels: no task reads bytes another core wrote), and on maps of few tiles, blocks of
// output channels too.
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  if (pb.N == 0 || pb.C == 0 || pb.P == 0) return;
  const int64_t K4 = k_padded(pb.K);
  std::vector<int32_t> wsum(static_cast<size_t>(pb.C));
  detail::weight_sums(pb, wsum.data());
  const int64_t tiles = (pb.P + kTilePixels - 1) / kTilePixels;
  // blocks of output channels (at least 16) where there are fewer than 8 pixel tiles to share out
  const int64_t blocks = pb.N * tiles >= 8 ? 1 : std::min<int64_t>((8 + pb.N * tiles - 1) / (pb.N * tiles),
                                                                   std::max<int64_t>(1, pb.C / 16));
  const int64_t per_block = ((pb.C + blocks - 1) / blocks + kRows - 1) / kRows * kRows;
  const int64_t units = pb.N * tiles * blocks;
  // in the float GEMM's multiply-adds (kParallelMinMacs): 64 multiply-adds an instruction, a
  // quarter of its work; but the epilogue's float steps cost an output about 16 (on MobileNetV2's
  // 16 -> 96 1x1 on 48x48 they take more time than the sums)
  const int64_t work = pb.N * pb.P * pb.C * (K4 / 4 + 16) + kMacsPerElement * pb.C * K4 / 4;
  SerialBelow<Par>{par, work < kParallelMinMacs}(int64_t(0), units, 1, [&](int64_t b, int64_t e) {
    // the task's blocks of one tile together: the tile is interleaved once
    for (int64_t u = b; u < e;) {
      const int64_t tile = u / blocks, last = std::min(e, (tile + 1) * blocks);
      const int64_t c0 = (u % blocks) * per_block, c1 = std::min(pb.C, (last - tile * blocks) * per_block);
      if (c0 < c1) detail::run_tile(pb, wsum.data(), tile / tiles, tile % tiles, c0, c1);
      u = last;
    }
  });
}

// Problem::w as rows or panels -> the VNNI kernel's: rows zero-padded to K4 where K is not a
// multiple of 4, panels regrouped into quads. Buffers of the calling thread kept between calls:
// a fresh one of a large weight's size is an mmap whose pages fault in on every call
// (1280 x 320: 22 us against 62 for the whole conv).
template <class Par>
inline void run_vnni(Problem pb, Par&& par) {
  const int64_t K = pb.K, K4 = k_padded(K), C = pb.C;
  thread_local std::vector<int8_t> padded;
  if (pb.panels) {
    const int64_t panels = (C + 15) / 16;
    padded.resize(std::max(padded.size(), static_cast<size_t>(panels * 16 * K4)));
    const int8_t* from = pb.w;
    int8_t* to = padded.data();
    // in parallel from 64 KB (1280 x 320: 15 us on one thread)
    SerialBelow<Par>{par, C * K < (int64_t(1) << 16)}(
        int64_t(0), panels, 1, [&](int64_t p0, int64_t p1) { to_quads(from, K, p0, p1, to); });
    pb.w = padded.data();
    pb.quads = true;
  } else if (K4 != K) {
    padded.resize(std::max(padded.size(), static_cast<size_t>(C * K4)));
    for (int64_t c = 0; c < C; ++c) {
      std::memcpy(padded.data() + c * K4, pb.w + c * K, static_cast<size_t>(K));
      std::memset(padded.data() + c * K4 + K, 0, static_cast<size_t>(K4 - K));
    }
    pb.w = padded.data();
  }
  pb.panels = false;
  run(pb, par);
}
#endif  // ETFUSE_HAVE_X86_DISPATCH

}  // namespace int8_pointwise
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/int8_neon.h"
#endif

namespace etfuse {
namespace core {
namespace int8_pointwise {

// ---- the chooser ------------------------------------------------------------------------------

using int8_epilogue::Geometry;

// Whether `conv` has an int8 kernel on the selected ISA: AVX-512 VNNI on x86; NEON (sdot with
// dot products, smlal without) on aarch64. Otherwise the float path.
#if !ETFUSE_HAVE_X86_DISPATCH
inline bool available() { return isa_at_least(Isa::kNeon); }
#endif

// The name of the kernel `conv` runs ("vnni", "neon-dot", "neon-mlal"), null: none.
inline const char* kernel_name() {
  if (!available()) return nullptr;
#if ETFUSE_HAVE_ARM_NEON
  return isa_at_least(Isa::kNeonDot) ? "neon-dot" : "neon-mlal";
#else
  return "vnni";
#endif
}

// The conv, when available(): Problem::w is rows [C][K] or (panels) GEMM panels.
template <class Par>
inline void conv(const Problem& pb, Par&& par) {
#if ETFUSE_HAVE_X86_DISPATCH
  run_vnni(pb, par);
#elif ETFUSE_HAVE_ARM_NEON
  arm::run(pb, std::strcmp(kernel_name(), "neon-dot") == 0, par);
#else
  (void)pb;
  (void)par;
#endif
}

// The im2col of one image (int8_epilogue::im2col) with this ISA's strided rows.
inline void im2col(const Geometry& g, const uint8_t* x, uint8_t pad, uint8_t* padded, uint8_t* col) {
#if ETFUSE_HAVE_X86_DISPATCH
  int8_epilogue::im2col(g, x, pad, padded, col, detail::strided_row);
#elif ETFUSE_HAVE_ARM_NEON
  int8_epilogue::im2col(g, x, pad, padded, col, arm::strided_row);
#else
  int8_epilogue::im2col(g, x, pad, padded, col, int8_epilogue::strided_bytes);
#endif
}

}  // namespace int8_pointwise
}  // namespace core
}  // namespace etfuse
