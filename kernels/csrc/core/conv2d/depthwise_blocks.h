// Depthwise convs (multiplier 1) a vector of channels at a time in an ISA's own code:
// depthwise_blocks_avx512 (16 channels) and depthwise_blocks_neon (4, arm::ChannelsNeon).
// run_paths takes them ahead of the other depthwise paths (uses_depthwise_blocks).
#pragma once

#include <algorithm>
#include <vector>

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif
#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/depthwise_neon.h"
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// A depthwise conv (multiplier 1) on AVX-512, 16 channels a vector, planes flat in and out:
// depthwise_channels' scheme written for it (its generic code took 2-5x its multiply-adds'
// time in moves). A block's 16 planes are transposed 16 pixels at a time into a zero-padded
// [PH][PW][16] buffer (written once per call around the interiors); an output pixel is one FMA
// per tap for the 16 channels, 8 pixels at a time; the results go back by the same transpose.
// Block t: image t / B, channels [t % B * 16, + 16), B = ceil(C / 16).
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX512 void depthwise_blocks_avx512(const Problem& pb, int64_t t0, int64_t t1);
#endif
#if defined(ETFUSE_CORE_KERNELS) && ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX512 void depthwise_blocks_avx512(const Problem& pb, int64_t t0, int64_t t1) {
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], P = OH * OW;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t PH = H + 2 * p.padding[0], PW = Wd + 2 * p.padding[1], taps = KH * KW, HW = H * Wd;
  const int64_t B = (C + 15) / 16;
  // whole vectors at 64-byte steps: aligned, or every load splits across two cache lines (the
  // taps' loads were half the kernel's time)
  thread_local std::vector<float> buf_v, sums_v, wt_v;
  float* const buf = aligned_floats(buf_v, static_cast<size_t>(PH * PW * 16));
  std::fill(buf, buf + PH * PW * 16, 0.0f);  // the border stays 0
  float* const sums = aligned_floats(sums_v, static_cast<size_t>((P + 15) / 16 * 16 * 16));
  float* const wt = aligned_floats(wt_v, static_cast<size_t>(taps * 16));
  std::vector<int64_t> off(static_cast<size_t>(taps)), base(static_cast<size_t>(P));
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) off[kh * KW + kw] = (kh * p.dilation[0] * PW + kw * p.dilation[1]) * 16;
  for (int64_t oh = 0, q = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow, ++q) base[q] = (oh * p.stride[0] * PW + ow * p.stride[1]) * 16;
  float lo_s, hi_s;
  clamp_bounds(p, lo_s, hi_s);
  const __m512 vlo = _mm512_set1_ps(lo_s), vhi = _mm512_set1_ps(hi_s);
  const bool flat_w = taps <= 16 && pb.lw.strides[3] == 1 && pb.lw.strides[2] == KW;
  const __mmask16 tap_lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, taps)) - 1u);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / B, c0 = t % B * 16, nc = std::min<int64_t>(16, C - c0);
    const float* src[16];
    for (int c = 0; c < 16; ++c) src[c] = pb.in + n * pb.li.strides[0] + (c0 + (c < nc ? c : 0)) * pb.li.strides[1];
    for (int64_t q0 = 0; q0 < HW; q0 += 16) {  // in: 16 pixels of the 16 planes at a time
      const int64_t m = std::min<int64_t>(16, HW - q0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
      gemm::detail::Vec<16>::type v[16];  // (as __m512: the same vector)
      for (int c = 0; c < 16; ++c) v[c] = _mm512_maskz_loadu_ps(lanes, src[c] + q0);
      transpose_block<16>(v);
      for (int64_t j = 0, ih = q0 / Wd, iw = q0 % Wd; j < m; ++j) {
        _mm512_storeu_ps(buf + ((ih + p.padding[0]) * PW + iw + p.padding[1]) * 16, v[j]);
        if (++iw == Wd) iw = 0, ++ih;
      }
    }
    // the weights tap by tap as 16-channel vectors, times the per-channel scale; the bias as seed
    alignas(64) float scale[16], seed[16];
    for (int c = 0; c < 16; ++c) {
      const int64_t co = c0 + (c < nc ? c : 0);
      scale[c] = pb.scale ? pb.scale[co * pb.scale_s] : 1.0f;
      seed[c] = pb.bias ? pb.bias[co * pb.bias_s] : 0.0f;
    }
    if (flat_w) {  // up to 16 taps a channel: one transpose (element by element it cost a third of 3x3 maps' time)
      gemm::detail::Vec<16>::type v[16];  // (as __m512: the same vector)
      for (int c = 0; c < 16; ++c) v[c] = _mm512_maskz_loadu_ps(tap_lanes, pb.w + (c0 + (c < nc ? c : 0)) * pb.lw.strides[0]);
      transpose_block<16>(v);
      for (int64_t k = 0; k < taps; ++k) _mm512_storeu_ps(wt + k * 16, v[k]);
    } else {
      for (int c = 0; c < 16; ++c) {
        const float* wk = pb.w + (c0 + (c < nc ? c : 0)) * pb.lw.strides[0];
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) wt[(kh * KW + kw) * 16 + c] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]];
      }
    }
    const __m512 vs = _mm512_load_ps(scale), vseed = _mm512_load_ps(seed);
    for (int64_t k = 0; k < taps; ++k) _mm512_storeu_ps(wt + k * 16, _mm512_mul_ps(_mm512_loadu_ps(wt + k * 16), vs));
    constexpr int kChains = 8;  // independent chains of FMAs: 2 FMAs a cycle of latency 4
    for (int64_t q = 0; q < P; q += kChains) {
      __m512 acc[kChains];
      const float* at[kChains];
      for (int u = 0; u < kChains; ++u) {
        acc[u] = vseed;
        at[u] = buf + base[std::min(q + u, P - 1)];  // past the end: a repeat, not stored
      }
      for (int64_t k = 0; k < taps; ++k) {
        const __m512 wk = _mm512_loadu_ps(wt + k * 16);
        const int64_t o = off[k];
        for (int u = 0; u < kChains; ++u) acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(at[u] + o), wk, acc[u]);
      }
      // clamp_act lane by lane: max(lo, r) and min(hi, r) return r where r is NaN
      for (int u = 0; u < kChains && q + u < P; ++u) {
        _mm512_storeu_ps(sums + (q + u) * 16, _mm512_min_ps(vhi, _mm512_max_ps(vlo, acc[u])));
      }
    }
    float* dst = pb.out + n * pb.lo.strides[0] + c0 * pb.lo.strides[1];
    for (int64_t q0 = 0; q0 < P; q0 += 16) {  // out: 16 pixels of the 16 channels at a time
      const int64_t m = std::min<int64_t>(16, P - q0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << m) - 1u);
      gemm::detail::Vec<16>::type v[16];  // (as __m512: the same vector)
      for (int j = 0; j < 16; ++j) v[j] = _mm512_loadu_ps(sums + std::min(q0 + j, P - 1) * 16);
      transpose_block<16>(v);
      for (int64_t c = 0; c < nc; ++c) _mm512_mask_storeu_ps(dst + c * pb.lo.strides[1] + q0, lanes, v[c]);
    }
  }
}
#endif

#if ETFUSE_HAVE_ARM_NEON
// A depthwise conv (multiplier 1, arm::ChannelsNeon's K and S, input rows 1 float a step), 4
// channels a vector. Block t: image t / B, channels [t % B * 4, + 4), B = ceil(C / 4); a last
// partial block reads its first channel for the missing ones and stores them to scratch.
void depthwise_blocks_neon(const Problem& pb, int64_t t0, int64_t t1);
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_blocks_neon(const Problem& pb, int64_t t0, int64_t t1) {
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], P = OH * OW;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], K = pb.lw.sizes[2], S = p.stride[0];
  const int64_t ph = p.padding[0], pw = p.padding[1], PH = H + 2 * ph, PW = Wd + 2 * pw;
  const int64_t B = (C + 3) / 4;
  thread_local std::vector<float> buf_v, sums_v, spare_v;
  buf_v.assign(static_cast<size_t>(PH * PW * 4), 0.0f);  // the border stays 0
  if (sums_v.size() < static_cast<size_t>(P * 4)) sums_v.resize(static_cast<size_t>(P * 4));
  if (spare_v.size() < static_cast<size_t>(P)) spare_v.resize(static_cast<size_t>(P));
  float* const buf = buf_v.data();
  float* const sums = sums_v.data();
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const auto rows = arm::ChannelsNeon::pick(K, S, p.has_max ? 2 : p.has_min ? 1 : 0);
  const bool flat_out = pb.lo.strides[3] == 1 && pb.lo.strides[2] == OW;
  alignas(16) float wt[25 * 4], seed[4];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / B, c0 = t % B * 4, nc = C - c0 < 4 ? C - c0 : 4;
    const float* src[4];
    for (int c = 0; c < 4; ++c) src[c] = pb.in + n * pb.li.strides[0] + (c0 + (c < nc ? c : 0)) * pb.li.strides[1];
    for (int64_t ih = 0; ih < H; ++ih) {
      const float* row[4] = {src[0] + ih * pb.li.strides[2], src[1] + ih * pb.li.strides[2],
                             src[2] + ih * pb.li.strides[2], src[3] + ih * pb.li.strides[2]};
      arm::ChannelsNeon::interleave(row, Wd, buf + ((ih + ph) * PW + pw) * 4);
    }
    // the per-channel scale folded into the weights, the bias as the sums' seed
    for (int c = 0; c < 4; ++c) {
      const int64_t co = c0 + (c < nc ? c : 0);
      const float sc = pb.scale ? pb.scale[co * pb.scale_s] : 1.0f;
      const float* wk = pb.w + co * pb.lw.strides[0];
      for (int64_t kh = 0; kh < K; ++kh)
        for (int64_t kw = 0; kw < K; ++kw) wt[(kh * K + kw) * 4 + c] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * sc;
      seed[c] = pb.bias ? pb.bias[co * pb.bias_s] : 0.0f;
    }
    rows(buf, PW, wt, seed, lo_v, hi_v, OH, OW, sums);
    float* dst[4];
    for (int c = 0; c < 4; ++c) dst[c] = c < nc ? pb.out + n * pb.lo.strides[0] + (c0 + c) * pb.lo.strides[1] : spare_v.data();
    if (flat_out) {
      arm::ChannelsNeon::deinterleave(sums, P, dst);
    } else {
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* const d[4] = {dst[0] + (dst[0] == spare_v.data() ? 0 : oh * pb.lo.strides[2]),
                             dst[1] + (dst[1] == spare_v.data() ? 0 : oh * pb.lo.strides[2]),
                             dst[2] + (dst[2] == spare_v.data() ? 0 : oh * pb.lo.strides[2]),
                             dst[3] + (dst[3] == spare_v.data() ? 0 : oh * pb.lo.strides[2])};
        arm::ChannelsNeon::deinterleave(sums + oh * OW * 4, OW, d);
      }
    }
  }
}
#endif
#endif

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
