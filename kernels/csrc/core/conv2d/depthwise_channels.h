// A depthwise conv on a small output map, W channels a vector (depthwise_channels): the block's
// planes interleaved into one zero-padded buffer, each tap one multiply-add for W channels.
// run_paths takes it for depthwise convs (multiplier 1) up to kChannelsMaxPixels outputs that
// the blocks, rows and flat kernels leave.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// The first m < W floats at p as a vector (the rest 0), and back: one masked move with AVX-512
// (element by element, a 3x3 map's 9 pixels of 16 planes took longer than its taps). Through
// memory and a call: an always-inline AVX-512 function does not inline into the generic template.
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX512 void move_first16(const float* from, float* to, int64_t m, bool zero_rest);
#endif
#if defined(ETFUSE_CORE_KERNELS) && ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX512 void move_first16(const float* from, float* to, int64_t m, bool zero_rest) {
  const __mmask16 k = static_cast<__mmask16>((1u << m) - 1u);
  if (zero_rest) {
    _mm512_storeu_ps(to, _mm512_maskz_loadu_ps(k, from));
  } else {
    _mm512_mask_storeu_ps(to, k, _mm512_maskz_loadu_ps(k, from));
  }
}
#endif
template <int W>
ETFUSE_ALWAYS_INLINE typename gemm::detail::Vec<W>::type load_first(const float* p, int64_t m) {
  typename gemm::detail::Vec<W>::type v = {};
#if ETFUSE_HAVE_X86_DISPATCH
  if (W == 16) {
    move_first16(p, reinterpret_cast<float*>(&v), m, true);
    return v;
  }
#endif
  for (int64_t j = 0; j < m; ++j) v[j] = p[j];
  return v;
}
template <int W>
ETFUSE_ALWAYS_INLINE void store_first(float* p, const typename gemm::detail::Vec<W>::type& v, int64_t m) {
#if ETFUSE_HAVE_X86_DISPATCH
  if (W == 16) {
    move_first16(reinterpret_cast<const float*>(&v), p, m, false);
    return;
  }
#endif
  for (int64_t j = 0; j < m; ++j) p[j] = v[j];
}

// A depthwise conv (one input channel per output channel) on a small output map, W channels at
// a time: direct_planes' per-plane setup (phase planes, weights, blocks of L outputs) costs far
// more than a 3x3 or 6x6 plane's multiply-adds (576 channels, 3x3 stride 2 on 6x6: 73 us against
// XNNPACK's 12). Here the block's input planes are interleaved into a zero-padded [PH][PW][W]
// buffer, so every tap of an output pixel is one vector multiply-add over the W channels, U
// pixels at a time; the sums go back to the W output planes. Block t = image t / blocks, channels
// [(t % blocks) * W, + W).
template <int W>
ETFUSE_ALWAYS_INLINE void depthwise_channels(const Problem& pb, int64_t t0, int64_t t1) {
  typedef typename gemm::detail::Vec<W>::type vf;
  constexpr int U = 4;
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], P = OH * OW;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t PH = H + 2 * p.padding[0], PW = Wd + 2 * p.padding[1], taps = KH * KW;
  const int64_t blocks = (C + W - 1) / W;
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  // whole vectors at 64-byte steps: aligned, or every load splits across two cache lines
  std::vector<float> buf_v, sums_v, wv_v;
  float* const buf = aligned_floats(buf_v, static_cast<size_t>(PH * PW * W));
  std::fill(buf, buf + PH * PW * W, 0.0f);  // the border stays 0
  float* const sums = aligned_floats(sums_v, static_cast<size_t>((P + W - 1) / W * W * W));
  float* const wv = aligned_floats(wv_v, static_cast<size_t>(taps * W));
  std::vector<int64_t> off(static_cast<size_t>(taps)), base(static_cast<size_t>(P));
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) off[kh * KW + kw] = (kh * p.dilation[0] * PW + kw * p.dilation[1]) * W;
  for (int64_t q = 0; q < P; ++q) base[q] = ((q / OW) * p.stride[0] * PW + (q % OW) * p.stride[1]) * W;
  const bool flat_in = pb.li.strides[3] == 1 && pb.li.strides[2] == Wd;
  const bool flat_out = pb.lo.strides[3] == 1 && pb.lo.strides[2] == OW;
  vf seed;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / blocks, c0 = (t % blocks) * W, nc = (C - c0) < W ? (C - c0) : W;
    const float* src[W];
    for (int64_t c = 0; c < W; ++c) {
      const int64_t co = c0 + (c < nc ? c : 0);  // lanes past C repeat a channel and are dropped
      src[c] = pb.in + n * pb.li.strides[0] + co * pb.li.strides[1];
    }
    // the W planes interleaved into buf: W x W blocks transposed in registers where the planes
    // are flat (a scalar gather per element cost as much as the taps on a 6x6 map); a last
    // block of m < W pixels is read as m floats per plane
    if (flat_in) {
      int64_t ih = 0, iw = 0;
      for (int64_t q0 = 0; q0 < H * Wd; q0 += W) {
        const int64_t m = (H * Wd - q0) < W ? (H * Wd - q0) : W;
        vf v[W];
        for (int c = 0; c < W; ++c) {
          if (m == W) {
            std::memcpy(&v[c], src[c] + q0, sizeof(vf));
          } else {
            v[c] = load_first<W>(src[c] + q0, m);
          }
        }
        transpose_block<W>(v);
        for (int64_t j = 0; j < m; ++j) {
          gemm::detail::store<W>(buf + ((ih + p.padding[0]) * PW + iw + p.padding[1]) * W, v[j]);
          if (++iw == Wd) iw = 0, ++ih;
        }
      }
    }
    for (int64_t c = 0; c < W; ++c) {
      if (!flat_in) {
        for (int64_t ih = 0; ih < H; ++ih) {
          float* d = buf + ((ih + p.padding[0]) * PW + p.padding[1]) * W + c;
          const float* row = src[c] + ih * pb.li.strides[2];
          for (int64_t iw = 0; iw < Wd; ++iw) d[iw * W] = row[iw * pb.li.strides[3]];
        }
      }
      const int64_t co = c0 + (c < nc ? c : 0);
      // the per-channel scale folded into the weights, the bias as the sums' seed (as direct_planes)
      const float s = pb.scale ? pb.scale[co * pb.scale_s] : 1.0f;
      const float* wk = pb.w + co * pb.lw.strides[0];
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
          wv[(kh * KW + kw) * W + c] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
      seed[c] = pb.bias ? pb.bias[co * pb.bias_s] : 0.0f;
    }
    const vf vlo = vf{} + lo_v, vhi = vf{} + hi_v;
    for (int64_t q0 = 0; q0 < P; q0 += U) {
      const int u_n = (P - q0) < U ? static_cast<int>(P - q0) : U;
      vf r[U];
      const float* x[U];
      for (int u = 0; u < U; ++u) {
        r[u] = seed;
        x[u] = buf + base[q0 + (u < u_n ? u : 0)];
      }
      for (int64_t k = 0; k < taps; ++k) {
        vf w;
        std::memcpy(&w, wv + k * W, sizeof(vf));
        for (int u = 0; u < U; ++u) {
          vf v;
          std::memcpy(&v, x[u] + off[k], sizeof(vf));
          r[u] += w * v;
        }
      }
      for (int u = 0; u < u_n; ++u) {
        r[u] = r[u] < vlo ? vlo : (r[u] > vhi ? vhi : r[u]);  // clamp_act lane by lane (NaN kept)
        gemm::detail::store<W>(sums + (q0 + u) * W, r[u]);
      }
    }
    // back to the W output planes, transposed as the input was (sums has room for a whole last
    // block)
    if (flat_out) {
      for (int64_t q0 = 0; q0 < P; q0 += W) {
        const int64_t m = (P - q0) < W ? (P - q0) : W;
        vf v[W];
        for (int c = 0; c < W; ++c) v[c] = gemm::detail::load<W>(sums + (q0 + c) * W);
        transpose_block<W>(v);
        for (int64_t c = 0; c < nc; ++c) {
          float* dst = pb.out + n * pb.lo.strides[0] + (c0 + c) * pb.lo.strides[1] + q0;
          if (m == W) {
            gemm::detail::store<W>(dst, v[c]);
          } else {
            store_first<W>(dst, v[c], m);
          }
        }
      }
      continue;
    }
    for (int64_t c = 0; c < nc; ++c) {
      float* oplane = pb.out + n * pb.lo.strides[0] + (c0 + c) * pb.lo.strides[1];
      const float* from = sums + c;
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* orow = oplane + oh * pb.lo.strides[2];
        for (int64_t ow = 0; ow < OW; ++ow) orow[ow * pb.lo.strides[3]] = from[(oh * OW + ow) * W];
      }
    }
  }
}

// Compiled once per library in core/kernels.cpp.
void depthwise_channels_baseline(const Problem& pb, int64_t t0, int64_t t1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_channels_avx2(const Problem& pb, int64_t t0, int64_t t1);
ETFUSE_TARGET_AVX512 void depthwise_channels_avx512(const Problem& pb, int64_t t0, int64_t t1);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_channels_baseline(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_channels<4>(pb, t0, t1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_channels_avx2(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_channels<8>(pb, t0, t1);
}
ETFUSE_TARGET_AVX512 void depthwise_channels_avx512(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_channels<16>(pb, t0, t1);
}
#endif
#endif

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
