// An int8 depthwise convolution (one input channel per output channel, stride 1 or 2,
// dilation 1, any kernel size and padding) on AVX-512, requantized in the same pass (aarch64:
// arch/arm/int8_depthwise_neon.h, integer sums, hooked in below).
//
// The float path converted the whole input to float integers in one pass, ran the float
// depthwise kernels, and requantized the float result in a third pass (MobileNetV2 int8: 96
// channels 3x3 stride 2 on 48x48, 124 us on one thread). Here each task takes whole planes: a
// plane is converted to exact floats (x - x_zp) with its zero padding into a buffer of the
// thread (for stride 2, split into its even and odd columns, so every tap reads 16 consecutive
// floats), the taps are FMAs of exact integers (every product and partial sum is an integer
// below 2^24: exact, in any order), and int8_epilogue::store16 requantizes 16 outputs at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "int8_epilogue.h"

namespace etfuse {
namespace core {
namespace int8_depthwise {

// Stride 1 or 2 (the same along H and W), dilation 1.
struct Problem : int8_epilogue::Geometry {
  const uint8_t* x = nullptr;  // the input's bytes [N][C][H][W], contiguous
  bool x_signed = true;        // int8 or uint8
  float x_zero_point = 0.0f;
  const int8_t* wq = nullptr;  // the weight [C][KH][KW], contiguous
  const float* w_zp = nullptr;  // its zero points [C] (null: 0)
  const float* w = nullptr;     // planes only: [C][KH][KW] float(wq) - w_zp[c]
  int8_epilogue::Requant requant;
  uint8_t* out = nullptr;  // [N][C][OH][OW] bytes, contiguous
};

// Everything below up to the aarch64 section is x86 (AVX-512BW); aarch64 has
// arch/arm/int8_depthwise_neon.h (integer sums); elsewhere the int8 depthwise convs take the float path.
#if ETFUSE_HAVE_X86_DISPATCH
// On where the ISA includes AVX-512 and the CPU has AVX-512BW/VL (the masked byte loads and
// stores).
inline bool available() { return cpu_features().avx512bw && isa_at_least(Isa::kAvx512); }

namespace detail {

// Planes [t0, t1) (plane t: image t / C, channel t % C). Compiled once per library in
// core/kernels.cpp.
ETFUSE_TARGET_AVX512BW void planes(const Problem& pb, int64_t t0, int64_t t1);
// Blocks of 16 channels [b0, b1) (block b: image b / B, channels from b % B * 16; B = C16 / 16).
ETFUSE_TARGET_AVX512BW void channel_blocks(const Problem& pb, int64_t b0, int64_t b1);

#if defined(ETFUSE_CORE_KERNELS)
// One input row as floats (x - x_zp) at dst[pad_w ..]; the zeros around it are written once
// per call (a zeroing loop per row became a memset call per row).
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE void convert_row(const Problem& pb, const uint8_t* src, float* dst) {
  const __m512 zp = _mm512_set1_ps(pb.x_zero_point);
  for (int64_t j = 0; j < pb.W; j += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, pb.W - j)) - 1u);
    const __m128i b = _mm_maskz_loadu_epi8(m, src + j);
    const __m512i v = pb.x_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    _mm512_mask_storeu_ps(dst + pb.padding[1] + j, m, _mm512_sub_ps(_mm512_cvtepi32_ps(v), zp));
  }
}

// A plane's rows into its buffer: row r of the padded input at r * pitch; for stride 2 its even
// columns there and its odd ones `phase` floats on, so that every tap reads 16 consecutive floats.
ETFUSE_TARGET_AVX512BW ETFUSE_ALWAYS_INLINE void fill_plane(const Problem& pb, const uint8_t* x, int64_t pitch,
                                                            int64_t phase, float* row, float* b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t ih = 0; ih < pb.H; ++ih) {
    const int64_t r = ih + pb.padding[0];
    if (pb.stride[0] == 1) {
      convert_row(pb, x + ih * pb.W, b + r * pitch);
      continue;
    }
    convert_row(pb, x + ih * pb.W, row);
    for (int64_t j = 0; j < pitch; j += 16) {
      const __m512 lo = _mm512_loadu_ps(row + 2 * j), hi = _mm512_loadu_ps(row + 2 * j + 16);
      _mm512_storeu_ps(b + r * pitch + j, _mm512_permutex2var_ps(lo, even, hi));
      _mm512_storeu_ps(b + phase + r * pitch + j, _mm512_permutex2var_ps(lo, odd, hi));
    }
  }
}

ETFUSE_TARGET_AVX512BW void planes(const Problem& pb, int64_t t0, int64_t t1) {
  const int64_t s = pb.stride[0], KH = pb.KH, KW = pb.KW, taps = KH * KW;
  const int64_t vecs = (pb.OW + 15) / 16, Hp = pb.H + 2 * pb.padding[0];
  // a row of the buffer: every tap of the last vector reads 16 floats inside it
  const int64_t pitch = (vecs * 16 + KW + 15) / 16 * 16;
  const int64_t phase = Hp * pitch, plane = phase * s;
  // Output vectors are computed 4 at a time (4 independent chains of FMAs); on small maps
  // (MobileNetV2's 960 channels on 3x3: 3 vectors a plane) from several planes at once.
  constexpr int64_t kChains = 4, kMaxGroup = 16;
  const int64_t positions = pb.OH * vecs;
  const int64_t group = std::min<int64_t>(kMaxGroup, std::max<int64_t>(1, 2 * kChains / positions));
  thread_local std::vector<float> buf, row;
  buf.assign(static_cast<size_t>(plane * group), 0.0f);  // the padding stays 0: only interiors are written
  row.assign(static_cast<size_t>(pitch * 2 + 16), 0.0f);
  std::vector<int64_t> off(static_cast<size_t>(taps));
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) off[kh * KW + kw] = s == 1 ? kh * pitch + kw : (kw & 1) * phase + kh * pitch + kw / 2;
  // per output vector q of a plane: where its taps start in the buffer, where it goes in the
  // output plane, its lanes (no integer division in the loops: one costs more than the taps)
  const __mmask16 last = static_cast<__mmask16>((1u << (pb.OW - (vecs - 1) * 16)) - 1u);
  std::vector<int64_t> in_at(static_cast<size_t>(positions)), out_at(static_cast<size_t>(positions));
  std::vector<__mmask16> lanes(static_cast<size_t>(positions));
  for (int64_t q = 0; q < positions; ++q) {
    const int64_t oh = q / vecs, v = q % vecs;
    in_at[q] = oh * s * pitch + v * 16;
    out_at[q] = oh * pb.OW + v * 16;
    lanes[q] = v == vecs - 1 ? last : 0xFFFF;
  }
  for (int64_t g0 = t0; g0 < t1; g0 += group) {
    const int64_t n = std::min(group, t1 - g0), total = n * positions;
    for (int64_t j = 0; j < n; ++j) fill_plane(pb, pb.x + (g0 + j) * pb.H * pb.W, pitch, phase, row.data(), buf.data() + j * plane);
    // chain u's plane j (channel c) and vector q, advanced without dividing
    int64_t j = 0, q = 0, c = g0 % pb.C;
    for (int64_t i = 0; i < total; i += kChains) {
      __m512 acc[kChains];
      const float* base[kChains];
      const float* wc[kChains];
      int64_t cs[kChains], qs[kChains], js[kChains];
      for (int u = 0; u < kChains; ++u) {
        // past the end: the last vector again, not stored
        js[u] = j, qs[u] = q, cs[u] = c;
        acc[u] = _mm512_setzero_ps();
        base[u] = buf.data() + j * plane + in_at[q];
        wc[u] = pb.w + c * taps;
        if (i + u + 1 < total && ++q == positions) {
          q = 0, ++j;
          if (++c == pb.C) c = 0;
        }
      }
      for (int64_t k = 0; k < taps; ++k) {
        for (int u = 0; u < kChains; ++u) {
          acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(base[u] + off[k]), _mm512_set1_ps(wc[u][k]), acc[u]);
        }
      }
      for (int u = 0; u < kChains && i + u < total; ++u) {
        int8_epilogue::store16(pb.requant, acc[u], cs[u], lanes[qs[u]],
                               pb.out + (g0 + js[u]) * pb.OH * pb.OW + out_at[qs[u]]);
      }
    }
  }
}

// Small maps (MobileNetV2's 960 channels on 3x3: 9 outputs a plane, 9 of a vector's 16 lanes),
// 16 channels a vector: the block's input planes are transposed (16 x 16 bytes at a time) into
// pixels of 16 channels, as floats, in a zero-padded [Hp][Wp][16] buffer; an output pixel is then
// one FMA per tap for all 16 channels; the 16-channel outputs go back to their planes by the same
// transpose.
ETFUSE_TARGET_AVX512BW void channel_blocks(const Problem& pb, int64_t b0, int64_t b1) {
  const int64_t s = pb.stride[0], KW = pb.KW, taps = pb.KH * KW, HW = pb.H * pb.W, P = pb.OH * pb.OW;
  const int64_t Wp = pb.W + 2 * pb.padding[1], Hp = pb.H + 2 * pb.padding[0], B = (pb.C + 15) / 16;
  thread_local std::vector<float> xbuf, wbuf;
  thread_local std::vector<uint8_t> obuf;  // 16 channels a pixel (bytes: a vector of __m128i drops its alignment)
  wbuf.resize(std::max(wbuf.size(), static_cast<size_t>(taps * 16)));
  float* wt = wbuf.data();
  xbuf.assign(static_cast<size_t>(Hp * Wp * 16), 0.0f);  // the padding stays 0: only interiors are written
  obuf.resize(static_cast<size_t>((P + 15) / 16 * 16 * 16));
  std::vector<int64_t> off(static_cast<size_t>(taps)), in_at(static_cast<size_t>(P));
  for (int64_t kh = 0; kh < pb.KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) off[kh * KW + kw] = (kh * Wp + kw) * 16;
  for (int64_t oh = 0, q = 0; oh < pb.OH; ++oh)
    for (int64_t ow = 0; ow < pb.OW; ++ow, ++q) in_at[q] = (oh * s * Wp + ow * s) * 16;
  const __m512 zp = _mm512_set1_ps(pb.x_zero_point);
  const bool has_bias = pb.requant.bias != nullptr;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n = blk / B, c0 = blk % B * 16, nc = std::min<int64_t>(16, pb.C - c0);
    const uint8_t* x = pb.x + (n * pb.C + c0) * HW;
    // in: 16 pixels of the 16 planes at a time (channels past C repeat channel c0, not stored)
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
      const int64_t m = std::min<int64_t>(16, HW - p0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
      __m128i v[16];
      for (int c = 0; c < 16; ++c) v[c] = _mm_maskz_loadu_epi8(lanes, x + (c < nc ? c : 0) * HW + p0);
      int8_epilogue::transpose16(v);
      for (int64_t j = 0, ih = p0 / pb.W, iw = p0 % pb.W; j < m; ++j) {
        const __m512i w = pb.x_signed ? _mm512_cvtepi8_epi32(v[j]) : _mm512_cvtepu8_epi32(v[j]);
        _mm512_storeu_ps(xbuf.data() + ((ih + pb.padding[0]) * Wp + iw + pb.padding[1]) * 16, _mm512_sub_ps(_mm512_cvtepi32_ps(w), zp));
        if (++iw == pb.W) iw = 0, ++ih;
      }
    }
    // the block's weights as 16-channel vectors, tap by tap: 16 taps at a time transposed as the
    // input is (a scalar loop over C x taps took as long as the taps on 960 channels on 3x3)
    const __mmask16 chans = static_cast<__mmask16>((1u << nc) - 1u);
    for (int64_t k0 = 0; k0 < taps; k0 += 16) {
      const int64_t m = std::min<int64_t>(16, taps - k0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
      __m128i v[16];
      for (int c = 0; c < 16; ++c) v[c] = _mm_maskz_loadu_epi8(lanes, pb.wq + (c0 + (c < nc ? c : 0)) * taps + k0);
      int8_epilogue::transpose16(v);
      const __m512 zps = pb.w_zp ? _mm512_maskz_loadu_ps(chans, pb.w_zp + c0) : _mm512_setzero_ps();
      for (int64_t j = 0; j < m; ++j) _mm512_storeu_ps(wt + (k0 + j) * 16, _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v[j])), zps));
    }
    const __m512 scale = _mm512_maskz_loadu_ps(chans, pb.requant.scale + c0);
    const __m512 bias = has_bias ? _mm512_maskz_loadu_ps(chans, pb.requant.bias + c0) : _mm512_setzero_ps();
    // 4 output pixels at a time: 4 independent chains of FMAs
    for (int64_t q = 0; q < P; q += 4) {
      __m512 acc[4];
      const float* base[4];
      for (int u = 0; u < 4; ++u) {
        acc[u] = _mm512_setzero_ps();
        base[u] = xbuf.data() + in_at[std::min(q + u, P - 1)];  // past the end: a repeat, not stored
      }
      for (int64_t k = 0; k < taps; ++k) {
        const __m512 wk = _mm512_loadu_ps(wt + k * 16);
        for (int u = 0; u < 4; ++u) acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(base[u] + off[k]), wk, acc[u]);
      }
      for (int u = 0; u < 4 && q + u < P; ++u) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(obuf.data() + (q + u) * 16),
                         int8_epilogue::requant16(pb.requant, acc[u], scale, has_bias, bias));
      }
    }
    // out: 16 pixels of the 16 channels at a time
    uint8_t* out = pb.out + (n * pb.C + c0) * P;
    for (int64_t p0 = 0; p0 < P; p0 += 16) {
      const int64_t m = std::min<int64_t>(16, P - p0);
      __m128i v[16];
      for (int j = 0; j < 16; ++j) v[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(obuf.data() + (p0 + j) * 16));
      int8_epilogue::transpose16(v);
      const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
      for (int64_t c = 0; c < nc; ++c) _mm_mask_storeu_epi8(out + c * P + p0, lanes, v[c]);
    }
  }
}
#endif

}  // namespace detail

// Output maps up to this many pixels run 16 channels a vector (detail::channel_blocks), larger
// ones plane by plane (detail::planes). Measured on the runtime (MobileNetV2 int8, us on 1 / 2
// threads, planes -> blocks): 960 channels on 3x3 40 / 40 -> 16 / 17, 384 on 6x6 27 / 25 -> 12 /
// 12, 144 stride 2 to 12x12 52 / 36 -> 25 / 24, 144 on 24x24 75 / 47 -> 50 / 44; but 32 on
// 48x48 52 / 33 -> 59 / 61 (a block of 16 channels is a task: 2 tasks).
constexpr int64_t kChannelBlockMaxPixels = 576;
inline bool uses_channel_blocks(const Problem& pb) { return pb.OH * pb.OW <= kChannelBlockMaxPixels; }

// The whole conv; `par` a parallel_for over planes.
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  const int64_t planes = pb.N * pb.C;
  if (planes == 0 || pb.OH == 0 || pb.OW == 0) return;
  if (uses_channel_blocks(pb)) {
    const int64_t blocks = pb.N * ((pb.C + 15) / 16);
    // per block: a tap is one FMA for 16 channels, the epilogue and transposes about 16 an output,
    // all 4 times the GEMM's cost (measured: 960 channels on 3x3, 11.5 us on one thread)
    const int64_t per_block = 64 * (pb.OH * pb.OW * (pb.KH * pb.KW + 16) + 8 * pb.H * pb.W);
    SerialBelow<Par>{par, blocks * per_block < kParallelMinMacs}(
        int64_t(0), blocks, 1, [&](int64_t b, int64_t e) { detail::channel_blocks(pb, b, e); });
    return;
  }
  // in the float GEMM's multiply-adds (kParallelMinMacs): a tap of 16 outputs is one FMA, the
  // epilogue about 12 an output, the conversion about 4 an input, all 4 times slower than the
  // GEMM's (loads, masks; measured: 144 channels stride 2 from 24x24, 54 us on one thread)
  const int64_t per_plane = 4 * (pb.OH * pb.OW * (pb.KH * pb.KW + 12) + 4 * pb.H * pb.W);
  SerialBelow<Par>{par, planes * per_plane < kParallelMinMacs}(
      int64_t(0), planes, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, per_plane)),
      [&](int64_t b, int64_t e) { detail::planes(pb, b, e); });
}
// The x86 kernel's weights are floats (any weight zero point).
inline bool takes_weight_zero_points(const float*, int64_t) { return true; }
// Whether the kernel beats the float path on an output map of `pixels`.
inline bool pays_off(int64_t) { return true; }
// Whether the caller passes Problem::w (floats; the kernel's planes read it).
inline bool needs_float_weights(const Problem& pb) { return !uses_channel_blocks(pb); }
#elif ETFUSE_HAVE_ARM_NEON
}  // namespace int8_depthwise
}  // namespace core
}  // namespace etfuse

#include "arch/arm/int8_depthwise_neon.h"

namespace etfuse {
namespace core {
namespace int8_depthwise {
// aarch64: arch/arm/int8_depthwise_neon.h's integer kernel, on where the ISA includes NEON
// (ETFUSE_KERNELS_ISA=baseline: the float path).
inline bool available() { return isa_at_least(Isa::kNeon); }
inline bool uses_channel_blocks(const Problem& pb) { return arm::uses_channel_blocks(pb); }
// Its weights are int16 (w - w_zp): integral zero points with |w - w_zp| small enough that the
// int32 sums are exact (the XNNPACK quantizer's are 0); others take the float path.
inline bool takes_weight_zero_points(const float* w_zp, int64_t C) {
  for (int64_t c = 0; w_zp && c < C; ++c) {
    if (!(w_zp[c] >= -255.0f && w_zp[c] <= 255.0f && w_zp[c] == static_cast<float>(static_cast<int>(w_zp[c])))) return false;
  }
  return true;
}
inline bool needs_float_weights(const Problem&) { return false; }
// Small maps run 8 channels a vector (arm::uses_channel_blocks), larger ones plane by plane.
inline bool pays_off(int64_t) { return true; }
template <class Par>
inline void run(const Problem& pb, Par&& par) {
  arm::run(pb, par);
}
#else
// No int8 depthwise kernel here: the callers take the float path.
inline bool available() { return false; }
inline bool uses_channel_blocks(const Problem&) { return false; }
inline bool takes_weight_zero_points(const float*, int64_t) { return true; }
inline bool pays_off(int64_t) { return false; }
inline bool needs_float_weights(const Problem&) { return false; }
template <class Par>
inline void run(const Problem&, Par&&) {}
#endif  // ETFUSE_HAVE_X86_DISPATCH

}  // namespace int8_depthwise
}  // namespace core
}  // namespace etfuse
