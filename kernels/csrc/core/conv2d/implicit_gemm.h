// The implicit GEMM, run_paths' path for the convs no other path takes (1x1 convs above all):
// the shared GEMM per (image, group), M = output channels, N = output pixels, K = C / groups *
// KH * KW, its B panels packed straight from the input windows (pack_windows) or read in place (run_implicit_gemm).
#pragma once

#include <cstring>
#include <vector>

#include "core/conv2d/common.h"

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

struct PackCtx {
  const float* in;  // image n, first channel of the group
  int64_t cs, hs, ws, H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw;
};

// dst[0, n) = src[0, n) in vectors of 4 (n is a panel's run: up to 32 floats; memcpy was a call).
ETFUSE_ALWAYS_INLINE void copy_run(float* dst, const float* src, int64_t n) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) gemm::detail::store<4>(dst + t, gemm::detail::load<4>(src + t));
  for (; t < n; ++t) dst[t] = src[t];
}

// dst[t] = src[2 t] for t < n, 4 at a time from 8 floats while they end before `end` (a stride-2
// conv's taps: one shuffle instead of four scalar loads and stores).
ETFUSE_ALWAYS_INLINE void even_run(float* dst, const float* src, int64_t n, const float* end) {
  typedef typename gemm::detail::Vec<4>::type v4;
  int64_t t = 0;
  for (; t + 4 <= n && src + 2 * t + 8 <= end; t += 4) {
    const v4 lo = gemm::detail::load<4>(src + 2 * t), hi = gemm::detail::load<4>(src + 2 * t + 4);
    gemm::detail::store<4>(dst + t, __builtin_shufflevector(lo, hi, 0, 2, 4, 6));
  }
  for (; t < n; ++t) dst[t] = src[2 * t];
}

// The pixels a 1x1 conv at stride (sh, sw) without padding reads, channels [0, C) of ctx's
// image: out[c][oh * OW + ow] = input[c, oh * sh, ow * sw], OH x OW per channel.
inline void sample_pixels(const PackCtx& ctx, int64_t C, int64_t OH, float* out) {
  const int64_t step = ctx.sw * ctx.ws;
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t oh = 0; oh < OH; ++oh, out += ctx.OW) {
      const float* row = ctx.in + c * ctx.cs + oh * ctx.sh * ctx.hs;
      if (step == 2) {  // element by element: a third of the op
        even_run(out, row, ctx.OW, row + ctx.W);
      } else {
        for (int64_t ow = 0; ow < ctx.OW; ++ow) out[ow] = row[ow * step];
      }
    }
  }
}

// One run of `run` output pixels (of one output row, its window corner at (ih0, iw0)) for the
// k rows [k0, k0 + kc) of a panel, zero past `run`: pack_windows' common case (a panel inside
// one output row), on its own so its loop keeps its values in registers. Step: the input
// stride between the run's pixels when known at compile time (1, 2), 0 otherwise.
template <int Step>
ETFUSE_ALWAYS_INLINE void pack_run(const PackCtx& c, int64_t k0, int64_t kc, int64_t ih0, int64_t iw0, int64_t run,
                                   int64_t NR, float* pack) {
  const int64_t H = c.H, W = c.W, hs = c.hs, ws = c.ws, sw = c.sw, dh = c.dh, dw = c.dw, KW = c.KW, KH = c.KH;
  const int64_t step = Step ? Step : sw * ws;
  int64_t kw = k0 % KW, kh = (k0 / KW) % KH;
  const float* plane = c.in + k0 / (KW * KH) * c.cs;
  for (int64_t kk = 0; kk < kc; ++kk, pack += NR) {
    const int64_t ih = ih0 + kh * dh, iw = iw0 + kw * dw;
    int64_t lo = 0, hi = run;
    if (static_cast<uint64_t>(ih) >= static_cast<uint64_t>(H)) {
      hi = 0;
    } else if (iw < 0 || iw + (run - 1) * sw >= W) {  // clipped by the padding
      valid_range(iw, sw, W, run, lo, hi);
    }
    for (int64_t t = 0; t < lo; ++t) pack[t] = 0.0f;
    if (hi > lo) {
      const float* row = plane + ih * hs;
      if constexpr (Step == 1) {
        copy_run(pack + lo, row + iw + lo, hi - lo);
      } else if constexpr (Step == 2) {
        even_run(pack + lo, row + iw + 2 * lo, hi - lo, row + W);
      } else {
        const float* src = row + iw * ws;
        for (int64_t t = lo; t < hi; ++t) pack[t] = src[t * step];
      }
    }
    for (int64_t t = hi; t < NR; ++t) pack[t] = 0.0f;
    if (++kw == KW) {
      kw = 0;
      if (++kh == KH) kh = 0, plane += c.cs;
    }
  }
}

// B(k, j) = input[ci, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw] (zero outside), with
// k = (ci * KH + kh) * KW + kw and j = oh * OW + ow.
constexpr int64_t kShortRow = 8, kMaxPanel = 32;  // kMaxPanel: the widest NR (AVX-512)
// Compiled once per library in core/kernels.cpp.
void pack_windows(const void* vctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack);
#if defined(ETFUSE_CORE_KERNELS)
void pack_windows(const void* vctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack) {
  const PackCtx& c = *static_cast<const PackCtx*>(vctx);
  if (c.KH == 1 && c.KW == 1 && c.sh == 1 && c.sw == 1 && c.ph == 0 && c.pw == 0 && c.ws == 1 && c.hs == c.W) {
    // a 1x1 conv over contiguous planes (pointwise convs): B is the input, [C, H * W]; whole
    // runs per channel instead of one run per output row (5 floats on DS-CNN's 25x5 maps)
    for (int64_t kk = 0; kk < kc; ++kk) {
      float* dst = pack + kk * NR;
      std::memcpy(dst, c.in + (k0 + kk) * c.cs + j0, sizeof(float) * nr);
      for (int64_t j = nr; j < NR; ++j) dst[j] = 0.0f;
    }
    return;
  }
  if (c.OW < kShortRow && NR <= kMaxPanel) {
    // output rows shorter than a panel (DS-CNN's 25x5 stem: 5 floats a row) would be several
    // short runs per k, each with its bounds worked out by division: here each panel column
    // gets its window's corner once, and every k reads one element a column, bounds by compare
    int64_t top[kMaxPanel], left[kMaxPanel], at[kMaxPanel];
    for (int64_t j = 0, oh = j0 / c.OW, ow = j0 % c.OW; j < nr; ++j) {
      top[j] = oh * c.sh - c.ph;
      left[j] = ow * c.sw - c.pw;
      at[j] = top[j] * c.hs + left[j] * c.ws;
      if (++ow == c.OW) ow = 0, ++oh;
    }
    int64_t kw = k0 % c.KW, kh = (k0 / c.KW) % c.KH;
    const float* plane = c.in + k0 / (c.KW * c.KH) * c.cs;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t dy = kh * c.dh, dx = kw * c.dw;
      const float* tap = plane + dy * c.hs + dx * c.ws;
      float* dst = pack + kk * NR;
      for (int64_t j = 0; j < nr; ++j) {
        const bool inside = static_cast<uint64_t>(top[j] + dy) < static_cast<uint64_t>(c.H) &&
            static_cast<uint64_t>(left[j] + dx) < static_cast<uint64_t>(c.W);
        dst[j] = inside ? tap[at[j]] : 0.0f;
      }
      for (int64_t j = nr; j < NR; ++j) dst[j] = 0.0f;
      if (++kw == c.KW) {
        kw = 0;
        if (++kh == c.KH) kh = 0, plane += c.cs;
      }
    }
    return;
  }
  // Each k row is runs of output pixels along one output row (one run when the panel does not
  // cross a row), the same runs for every k: they are worked out once per panel, the tap (kh,
  // kw) and the plane follow k by counting, and a run whose window row lies inside the image is
  // a straight copy. Worked out per k and per run (divisions, a memcpy call), packing took a
  // fifth of a 3x3 conv's instructions on aarch64.
  if (j0 % c.OW + nr <= c.OW) {  // one run
    const int64_t ih0 = j0 / c.OW * c.sh - c.ph, iw0 = j0 % c.OW * c.sw - c.pw;
    if (c.ws == 1 && c.sw == 1) return pack_run<1>(c, k0, kc, ih0, iw0, nr, NR, pack);
    if (c.ws == 1 && c.sw == 2) return pack_run<2>(c, k0, kc, ih0, iw0, nr, NR, pack);
    return pack_run<0>(c, k0, kc, ih0, iw0, nr, NR, pack);
  }
  int64_t run_at[kMaxPanel], run_len[kMaxPanel], run_ih[kMaxPanel], run_iw[kMaxPanel];  // nr <= NR <= kMaxPanel
  int64_t runs = 0;
  for (int64_t jj = 0, oh = j0 / c.OW, ow = j0 % c.OW; jj < nr; ++runs, ow = 0, ++oh) {
    run_at[runs] = jj;
    run_len[runs] = (nr - jj) < (c.OW - ow) ? (nr - jj) : (c.OW - ow);
    run_ih[runs] = oh * c.sh - c.ph;
    run_iw[runs] = ow * c.sw - c.pw;
    jj += run_len[runs];
  }
  const int64_t H = c.H, W = c.W, sw = c.sw, ws = c.ws, hs = c.hs, step = sw * ws;
  int64_t kw = k0 % c.KW, kh = (k0 / c.KW) % c.KH;
  const float* plane = c.in + k0 / (c.KW * c.KH) * c.cs;
  for (int64_t kk = 0; kk < kc; ++kk) {
    float* dst = pack + kk * NR;
    const int64_t dy = kh * c.dh, dx = kw * c.dw;
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t run = run_len[r], ih = run_ih[r] + dy, iw0 = run_iw[r] + dx;
      float* d = dst + run_at[r];
      if (static_cast<uint64_t>(ih) >= static_cast<uint64_t>(H)) {
        for (int64_t t = 0; t < run; ++t) d[t] = 0.0f;
        continue;
      }
      const float* row = plane + ih * hs;
      int64_t lo = 0, hi = run;
      if (iw0 < 0 || iw0 + (run - 1) * sw >= W) valid_range(iw0, sw, W, run, lo, hi);  // clipped by the padding
      for (int64_t t = 0; t < lo; ++t) d[t] = 0.0f;
      if (step == 1) {
        copy_run(d + lo, row + iw0 + lo, hi - lo);
      } else if (step == 2 && ws == 1) {
        even_run(d + lo, row + iw0 + 2 * lo, hi - lo, row + W);
      } else {
        const float* src = row + iw0 * ws;
        for (int64_t t = lo; t < hi; ++t) d[t] = src[t * step];
      }
      for (int64_t t = hi; t < run; ++t) d[t] = 0.0f;
    }
    for (int64_t j = nr; j < NR; ++j) dst[j] = 0.0f;
    if (++kw == c.KW) {
      kw = 0;
      if (++kh == c.KH) kh = 0, plane += c.cs;
    }
  }
}
#endif

// The implicit GEMM (run_paths' last path), image by image and group by group.
template <class Par>
inline void run_implicit_gemm(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = Cout / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  std::vector<float> sampled;  // a strided 1x1 conv's input pixels
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      detail::PackCtx ctx{
          pb.in + n * pb.li.strides[0] + g * Cg * pb.li.strides[1], pb.li.strides[1], pb.li.strides[2],
          pb.li.strides[3], pb.li.sizes[2], pb.li.sizes[3], KH, KW, OW, p.stride[0], p.stride[1], p.padding[0],
          p.padding[1], p.dilation[0], p.dilation[1]};
      gemm::Args a;
      a.M = Mg;
      a.N = OH * OW;
      a.K = Cg * KH * KW;
      a.A = pb.w + g * Mg * pb.lw.strides[0];
      a.a_rs = pb.lw.strides[0];
      a.a_cs = 1;
      a.pack = &detail::pack_windows;
      a.pack_ctx = &ctx;
      const bool pointwise = KH == 1 && KW == 1 && p.padding[0] == 0 && p.padding[1] == 0;
      if (pointwise && p.stride[0] == 1 && p.stride[1] == 1 && pb.li.strides[3] == 1 &&
          pb.li.strides[2] == pb.li.sizes[3]) {
        // a 1x1 conv over flat planes: B is the input [C, H * W] itself, read in place
        a.B = ctx.in;
        a.b_rs = ctx.cs;
        a.b_cs = 1;
        a.b_direct = true;
      } else if (pointwise && (p.stride[0] > 1 || p.stride[1] > 1)) {
        // a strided 1x1 conv (a ResNet shortcut): B is the input's sampled pixels, gathered once
        // into flat planes. pack_windows gathered them per panel, element by element: half of
        // ResNet8's 16 -> 32 at stride 2 (7 us).
        sampled.resize(static_cast<size_t>(Cg * OH * OW));
        detail::sample_pixels(ctx, Cg, OH, sampled.data());
        a.B = sampled.data();
        a.b_rs = OH * OW;
        a.b_cs = 1;
        a.b_direct = true;
      }
      // out[n, g * Mg + i, oh, ow] with j = oh * OW + ow: one stride along j when the rows of
      // the output plane are contiguous (checked by the caller).
      detail::channels_out(pb, n, g * Mg, false, a);
      gemm::run(a, par);
    }
  }
}

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
