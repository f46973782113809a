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
#pragma once

#include <algorithm>
#include <atomic>
#include <vector>

#include "common.h"
#include "gemm.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif
#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/depthwise_neon.h"
#endif

namespace etfuse {
namespace core {
namespace conv2d {

struct Params {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  int64_t groups = 1;
  bool has_min = false, has_max = false;
  float min = 0.0f, max = 0.0f;
};

// The output clamp's bounds (none: +-inf).
inline void clamp_bounds(const Params& p, float& lo, float& hi) {
  lo = p.has_min ? p.min : -__builtin_inff();
  hi = p.has_max ? p.max : __builtin_inff();
}

// Reads an int[2] argument (1 value means both dims, like torch).
template <class T>
inline bool pair(const char* what, const T* v, int64_t n, int64_t (&out)[2], Status& st) {
  if (n == 1) {
    out[0] = out[1] = static_cast<int64_t>(v[0]);
  } else if (n == 2) {
    out[0] = static_cast<int64_t>(v[0]);
    out[1] = static_cast<int64_t>(v[1]);
  } else {
    return st.fail("etfuse::conv2d_act: %s must have 1 or 2 values, got %lld", what, (long long)n);
  }
  return true;
}

inline bool out_shape(
    const Layout& in, const Layout& w, const Layout* bias, const Params& p, int& ndim, int64_t* sizes, Status& st) {
  if (in.ndim != 4) return st.fail("etfuse::conv2d_act: input must be 4-D [N, C, H, W], got %s", ShapeStr(in).c_str());
  if (w.ndim != 4) {
    return st.fail("etfuse::conv2d_act: weight must be 4-D [Cout, C/groups, KH, KW], got %s", ShapeStr(w).c_str());
  }
  for (int d = 0; d < 2; ++d) {
    if (p.stride[d] < 1 || p.dilation[d] < 1 || p.padding[d] < 0) {
      return st.fail(
          "etfuse::conv2d_act: stride [%lld, %lld] and dilation [%lld, %lld] must be >= 1, padding [%lld, %lld] >= 0",
          (long long)p.stride[0], (long long)p.stride[1], (long long)p.dilation[0], (long long)p.dilation[1],
          (long long)p.padding[0], (long long)p.padding[1]);
    }
  }
  const int64_t C = in.sizes[1], Cout = w.sizes[0], G = p.groups;
  if (G < 1 || C % G != 0 || Cout % G != 0 || w.sizes[1] * G != C) {
    return st.fail(
        "etfuse::conv2d_act: input %s, weight %s and groups %lld do not fit (C and Cout must be divisible by groups, "
        "weight.size(1) == C / groups)", ShapeStr(in).c_str(), ShapeStr(w).c_str(), (long long)G);
  }
  if (bias && !(bias->ndim == 1 && bias->sizes[0] == Cout)) {
    return st.fail("etfuse::conv2d_act: bias must have shape [%lld], got %s", (long long)Cout, ShapeStr(*bias).c_str());
  }
  int64_t o[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t span = p.dilation[d] * (w.sizes[2 + d] - 1) + 1;
    const int64_t padded = in.sizes[2 + d] + 2 * p.padding[d];
    if (padded < span) {
      return st.fail(
          "etfuse::conv2d_act: kernel %s (dilated) is larger than the padded input %s", ShapeStr(w).c_str(),
          ShapeStr(in).c_str());
    }
    o[d] = (padded - span) / p.stride[d] + 1;
  }
  ndim = 4;
  sizes[0] = in.sizes[0];
  sizes[1] = Cout;
  sizes[2] = o[0];
  sizes[3] = o[1];
  return true;
}

struct Problem {
  const float* in = nullptr;
  Layout li;
  const float* w = nullptr;
  Layout lw;
  const float* bias = nullptr;
  int64_t bias_s = 0;
  // Optional per-output-channel scale applied before the bias (null: none); set by the caller
  // after make_problem: out = clamp(conv * scale[c] + bias[c]).
  const float* scale = nullptr;
  int64_t scale_s = 0;
  float* out = nullptr;
  Layout lo;
  Params p;
  // The weight packed at fuse time (conv2d_packed_act: pack_gemm_weight of weight.reshape(Cout, K),
  // groups 1), or null. `w` is then unused and `lw` only gives the weight's shape.
  const float* packed = nullptr;
  // The same in int8 (etfuse::quantized_conv2d_packed; gemm::Args::packed_b_i8).
  const int8_t* packed_i8 = nullptr;
  // Optional values added before the clamp (a residual block's skip connection): out's shape
  // and out's strides (the adapter copies it where they differ), so element (n, c, h, w) of
  // both is at the same offset. Set by the caller after make_problem.
  const float* residual = nullptr;
};

namespace detail {

// [lo, hi): the t in [0, n) with 0 <= base + t * step < limit (step >= 1).
ETFUSE_ALWAYS_INLINE void valid_range(int64_t base, int64_t step, int64_t limit, int64_t n, int64_t& lo, int64_t& hi) {
  lo = base >= 0 ? 0 : (-base + step - 1) / step;
  hi = base >= limit ? 0 : (limit - 1 - base) / step + 1;
  if (hi > n) hi = n;
  if (lo > hi) lo = hi;
}

// fn over [0, n) in one call when n <= grain, else split by `par`; grain_for: how many tasks of
// `work` multiply-adds make one chunk of about `budget` (at least 1), counting each task's setup
// (copying its plane in and out, its weights) as kTaskSetup multiply-adds more: a depthwise
// plane of 3x3 outputs is 81 multiply-adds but about 36 ns, so 256 of them fell under one budget
// and ran on one thread (MobileNetV1's 256-channel 3x3: 9.9 -> 6.1 us a layer on two).
constexpr int64_t kTaskSetup = 1024;
template <class Par, class F>
inline void serial_or_parallel(int64_t n, int64_t grain, Par&& par, const F& fn) {
  if (n <= grain) {
    fn(int64_t(0), n);
  } else {
    par(int64_t(0), n, grain, fn);
  }
}

inline int64_t grain_for(int64_t budget, int64_t work) {
  const int64_t g = budget / ((work > 0 ? work : 1) + kTaskSetup);
  return g < 1 ? 1 : g;
}

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

// n floats from src to dst (n small: a row of a feature map; the two do not overlap): whole
// vectors, the rest as one more vector ending at n (overlapping the last) or, under W, two
// narrower ones. No element loop: GCC turns one into a libc memcpy call, which cost more than
// the copy on 8-32 float rows.
template <int W>
ETFUSE_ALWAYS_INLINE void copy_row(float* dst, const float* src, int64_t n) {
  if (n >= W) {
    int64_t j = 0;
    for (; j + W <= n; j += W) gemm::detail::store<W>(dst + j, gemm::detail::load<W>(src + j));  // not memcpy: see store
    if (j < n) gemm::detail::store<W>(dst + n - W, gemm::detail::load<W>(src + n - W));
  } else if constexpr (W > 4) {
    copy_row<W / 2>(dst, src, n);
  } else {
    if (n >= 2) {
      std::memcpy(dst, src, 2 * sizeof(float));  // a constant size: one 8-byte move, no call
      dst[n - 1] = src[n - 1];
    } else if (n == 1) {
      dst[0] = src[0];
    }
  }
}

// n zeros at dst, by the same moves as copy_row (a zeroing loop or std::fill is a libc memset
// call, per row of padding: the split of a 64-channel 8x8 map made over a thousand).
template <int W>
ETFUSE_ALWAYS_INLINE void zero_row(float* dst, int64_t n) {
  typedef typename gemm::detail::Vec<W>::type vf;
  if (n >= W) {
    int64_t j = 0;
    for (; j + W <= n; j += W) gemm::detail::store<W>(dst + j, vf{});
    if (j < n) gemm::detail::store<W>(dst + n - W, vf{});
  } else if constexpr (W > 4) {
    zero_row<W / 2>(dst, n);
  } else if (n > 0) {
    dst[0] = 0.0f;
    dst[n > 1 ? 1 : 0] = 0.0f;
    dst[n - 1] = 0.0f;  // n <= 3
  }
}

// The phase planes' geometry (direct_planes): SH x SW planes, sh * sw of them per input channel.
struct PhaseGeom {
  int64_t SH, SW, plane, channel;
  explicit PhaseGeom(const Problem& pb) {
    const Params& p = pb.p;
    SH = pb.lo.sizes[2] + (pb.lw.sizes[2] - 1) * p.dilation[0] / p.stride[0];
    SW = pb.lo.sizes[3] + (pb.lw.sizes[3] - 1) * p.dilation[1] / p.stride[1];
    plane = SH * SW;
    channel = p.stride[0] * p.stride[1] * plane;
    reach = (pb.lw.sizes[2] - 1) * p.dilation[0] / p.stride[0];
  }
  int64_t reach;  // the phase rows below an output row that its taps read
  // tap[(c * KH + kh) * KW + kw]: where tap (kh, kw) of channel c reads in the phase planes at
  // `phases` (Cg channels, each `chan` floats, its planes `pl` apart; the whole planes by
  // default): output q = oh * SW + ow reads tap[k][q].
  void taps(const Problem& pb, const float* phases, const float** tap) const { taps(pb, phases, tap, plane, channel); }
  void taps(const Problem& pb, const float* phases, const float** tap, int64_t pl, int64_t chan) const {
    const Params& p = pb.p;
    const int64_t Cg = pb.li.sizes[1] / p.groups, KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t a = kh * p.dilation[0] % p.stride[0], b = kw * p.dilation[1] % p.stride[1];
          tap[(c * KH + kh) * KW + kw] = phases + c * chan + (a * p.stride[1] + b) * pl +
              (kh * p.dilation[0] / p.stride[0]) * SW + kw * p.dilation[1] / p.stride[1];
        }
  }
};

// Which phase rows a split writes, and where: rows [i0, i1) of every phase plane, the planes
// `plane` floats apart and the channels `channel`; with `pad`, the padding positions of those
// rows are written too (zeros), else only the input positions (the buffer zeroed once).
struct PhaseRows {
  int64_t i0, i1, plane, channel;
  bool pad;
};

// Input channels [c0, c1) of image n, group `group` into their phase planes at `phases`: rows
// `r` (PhaseRows) of them, or the whole planes of g.channel floats, zeroed beforehand (only the
// input positions are written). W: the vector width of the row moves.
template <int W>
ETFUSE_ALWAYS_INLINE void split_phase_rows(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, int64_t c0,
                                           int64_t c1, float* phases, const PhaseRows& r) {
  const Params& p = pb.p;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], Cg = pb.li.sizes[1] / p.groups;
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t ihs = pb.li.strides[2], iws = pb.li.strides[3];
  for (int64_t a = 0; a < sh; ++a) {
    // phase (a, b) holds input rows i * sh + a - ph in [0, H), columns j * sw + b - pw in [0, Wd)
    int64_t ilo, ihi;
    valid_range(a - ph, sh, H, g.SH, ilo, ihi);
    for (int64_t b = 0; b < sw; ++b) {
      int64_t jlo, jhi;
      valid_range(b - pw, sw, Wd, g.SW, jlo, jhi);
      const int64_t jn = jhi - jlo;
      const int64_t rlo = ilo > r.i0 ? ilo : r.i0, rhi = ihi < r.i1 ? ihi : r.i1;
      for (int64_t c = c0; c < c1; ++c) {
        const float* src = pb.in + n * pb.li.strides[0] + (group * Cg + c) * pb.li.strides[1];
        float* dst = phases + c * r.channel + (a * sw + b) * r.plane - r.i0 * g.SW;  // row i at dst + i * SW
        const float* from = src + (b - pw + jlo * sw) * iws;
        // the rows of padding above and below, and the columns left and right of the input
        for (int64_t i = r.pad ? r.i0 : rlo; i < rlo; ++i) zero_row<W>(dst + i * g.SW, g.SW);
        for (int64_t i = rlo; i < rhi; ++i) {
          const float* row = from + (i * sh + a - ph) * ihs;
          float* d = dst + i * g.SW;
          if (r.pad) {
            zero_row<W>(d, jlo);
            zero_row<W>(d + jhi, g.SW - jhi);
          }
          d += jlo;
          if (sw == 1 && iws == 1) {
            copy_row<W>(d, row, jn);  // inline: a libc call per short row was 13% of a 16 -> 16 conv on 32x32
          } else if (sw == 2 && iws == 1) {
            for (int64_t j = 0; j < jn; ++j) d[j] = row[2 * j];  // a constant step GCC vectorises
          } else {
            for (int64_t j = 0; j < jn; ++j) d[j] = row[j * sw * iws];
          }
        }
        for (int64_t i = rhi; i < (r.pad ? r.i1 : rhi); ++i) zero_row<W>(dst + i * g.SW, g.SW);
      }
    }
  }
}

ETFUSE_ALWAYS_INLINE void split_phases(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, int64_t c0,
                                       int64_t c1, float* phases) {
  split_phase_rows<4>(pb, g, n, group, c0, c1, phases, PhaseRows{0, g.SH, g.plane, g.channel, false});
}

#if ETFUSE_HAVE_X86_DISPATCH
// split_phase_rows for the phase-plane GEMM's tasks (AVX2 and up), in the selected ISA's
// vectors (compiled once per library in core/kernels.cpp). In SSE2 moves it took a third of
// ResNet8's phase-plane convs on the runtime (a task's 160 rows of 34 floats: 2.6 of 11 us).
ETFUSE_TARGET_AVX2 void split_rows_avx2(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                        const PhaseRows& r);
ETFUSE_TARGET_AVX512 void split_rows_avx512(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                            const PhaseRows& r);
#if defined(ETFUSE_CORE_KERNELS)
ETFUSE_TARGET_AVX2 void split_rows_avx2(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                        const PhaseRows& r) {
  split_phase_rows<8>(pb, g, n, group, 0, pb.li.sizes[1] / pb.p.groups, phases, r);
}
// On AVX-512, rows read along their width at stride 1 or 2 (the phase-plane GEMM's convs):
// each plane's rows are zeroed whole, then each input row is one masked load (two and a
// permute for stride 2's even or odd columns) and one masked store per 16 columns. The generic
// loop's per-row zeroing, tails and index math cost 4 ns a row, and its stride-2 copy 8 (GCC's
// AVX-512 gather of even columns on rows of 8-16): ResNet8's 32 -> 64 stride-2 split 9.3 -> 2.4 us, 64 -> 64 on 8x8 2.5 -> 0.9.
//
// The masks that move m <= 16 columns of a row: `out` the m columns written; at stride 2, `lo`
// and `hi` the 2m - 1 input floats read, in two vectors.
struct RowMasks {
  __mmask16 out, lo, hi;
  explicit RowMasks(int64_t m) {
    const int64_t need = 2 * m - 1;
    out = static_cast<__mmask16>((1u << m) - 1u);
    lo = static_cast<__mmask16>((1u << (need < 16 ? need : 16)) - 1u);
    hi = static_cast<__mmask16>((1u << (need > 16 ? need - 16 : 0)) - 1u);
  }
};
ETFUSE_TARGET_AVX512 void split_rows_avx512(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                            const PhaseRows& r) {
  const Params& p = pb.p;
  const int64_t Cg = pb.li.sizes[1] / p.groups;
  if (!r.pad || pb.li.strides[3] != 1 || p.stride[1] > 2) {
    split_phase_rows<16>(pb, g, n, group, 0, Cg, phases, r);
    return;
  }
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3];
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t ihs = pb.li.strides[2];
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const int64_t span = (r.i1 - r.i0) * g.SW;  // a plane's rows in the buffer, contiguous
  for (int64_t a = 0; a < sh; ++a) {
    int64_t ilo, ihi;
    valid_range(a - ph, sh, H, g.SH, ilo, ihi);
    const int64_t rlo = ilo > r.i0 ? ilo : r.i0, rhi = ihi < r.i1 ? ihi : r.i1;
    for (int64_t b = 0; b < sw; ++b) {
      int64_t jlo, jhi;
      valid_range(b - pw, sw, Wd, g.SW, jlo, jhi);
      const int64_t jn = jhi - jlo;
      for (int64_t c = 0; c < Cg; ++c) {
        const float* src = pb.in + n * pb.li.strides[0] + (group * Cg + c) * pb.li.strides[1] + (b - pw + jlo * sw);
        float* dst = phases + c * r.channel + (a * sw + b) * r.plane;
        zero_row<16>(dst, span);
        if (jn <= 0) continue;
        if (jn <= 16) {  // one vector a row (maps up to 16 wide, 32 at stride 2): the masks hoisted
          const RowMasks k(jn);
          const __mmask16 out = k.out, lo = k.lo, hi = k.hi;
          const float* row = src + (rlo * sh + a - ph) * ihs;
          float* d = dst + (rlo - r.i0) * g.SW + jlo;
          if (sw == 1) {
            for (int64_t i = rlo; i < rhi; ++i, row += sh * ihs, d += g.SW) _mm512_mask_storeu_ps(d, out, _mm512_maskz_loadu_ps(out, row));
          } else {
            for (int64_t i = rlo; i < rhi; ++i, row += sh * ihs, d += g.SW) {
              const __m512 v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo, row), even, _mm512_maskz_loadu_ps(hi, row + 16));
              _mm512_mask_storeu_ps(d, out, v);
            }
          }
          continue;
        }
        for (int64_t i = rlo; i < rhi; ++i) {
          const float* row = src + (i * sh + a - ph) * ihs;
          float* d = dst + (i - r.i0) * g.SW + jlo;
          for (int64_t j = 0; j < jn; j += 16) {
            const RowMasks k(jn - j < 16 ? jn - j : 16);
            const __m512 v = sw == 1 ? _mm512_maskz_loadu_ps(k.out, row + j)
                                     : _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(k.lo, row + 2 * j), even,
                                                              _mm512_maskz_loadu_ps(k.hi, row + 2 * j + 16));
            _mm512_mask_storeu_ps(d + j, k.out, v);
          }
        }
      }
    }
  }
}
#endif
#endif  // ETFUSE_HAVE_X86_DISPATCH

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

using gemm::detail::transpose_block;  // (gemm.h: the transposed problems' epilogue uses it too)

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

// sums[q0, q0 + U * W) of depthwise_flat: `x` is the plane's copy at q0, tap (kh, kw) at
// x + kh * row + kw * dw; wl the weights [KH, KW]; mask / whole as in depthwise_flat.
template <int W, int U>
ETFUSE_ALWAYS_INLINE void flat_block(const float* x, int64_t KH, int64_t KW, int64_t row, int64_t dw,
                                     const float* wl, const int32_t* mask, int64_t mask_s, const char* whole,
                                     float seed, float lo, float hi, float* sums) {
  typedef typename gemm::detail::Vec<W>::type vf;
  typedef int32_t vi __attribute__((vector_size(W * 4)));
  vf acc[U];
  for (int u = 0; u < U; ++u) acc[u] = vf{} + seed;
  for (int64_t kw = 0; kw < KW; ++kw) {
    vf part[U] = {};
    for (int64_t kh = 0; kh < KH; ++kh) {
      const float* xr = x + kw * dw + kh * row;
      const float wv = wl[kh * KW + kw];
      for (int u = 0; u < U; ++u) {
        vf v;
        std::memcpy(&v, xr + u * W, sizeof(vf));
        part[u] += wv * v;
      }
    }
    if (whole[kw]) {
      for (int u = 0; u < U; ++u) acc[u] += part[u];
    } else {
      for (int u = 0; u < U; ++u) {
        vi m;
        std::memcpy(&m, mask + kw * mask_s + u * W, sizeof(vi));
        acc[u] = m ? acc[u] + part[u] : acc[u];
      }
    }
  }
  const vf vlo = vf{} + lo, vhi = vf{} + hi;
  for (int u = 0; u < U; ++u) {
    acc[u] = acc[u] < vlo ? vlo : (acc[u] > vhi ? vhi : acc[u]);  // clamp_act (NaN kept)
    gemm::detail::store<W>(sums + u * W, acc[u]);
  }
}

// A stride-1 depthwise conv whose output rows are as wide as its input rows (same padding along
// the width: 2 * pw == (KW - 1) * dw), on any map: the plane is flattened (q = oh * W + ow) and
// every tap is one contiguous multiply-add at the constant offset (kh * dh - ph) * W + kw * dw - pw,
// with no per-row copies or dropped columns (direct_planes pays both; on DS-CNN's 25x5 maps, 5
// floats a row, they cost more than the multiply-adds). A read off a row's left or right edge
// lands on the neighbouring row, so the taps of each kernel column are summed apart and added
// only in the lanes where that column is inside the row (a select, not a multiply by 0: an inf
// next door stays out). The rows above and below are the zero rows around the plane's one-memcpy
// copy. One plane per task.
template <int W>
ETFUSE_ALWAYS_INLINE void depthwise_flat(const Problem& pb, int64_t t0, int64_t t1) {
  constexpr int64_t slack = 4 * W;  // the last block's over-read and over-write
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], P = OH * OW;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const int64_t LP = (P + W - 1) / W * W, A = ph * Wd + pw;  // A: where the plane starts in `buf`
  int64_t size = LP + slack + (KH - 1) * dh * Wd + (KW - 1) * dw;  // past the last tap read
  if (size < A + H * Wd) size = A + H * Wd;
  std::vector<float> buf(static_cast<size_t>(size), 0.0f), sums(static_cast<size_t>(LP + slack));
  std::vector<float> wl(static_cast<size_t>(KH * KW));
  // mask[kw][q]: -1 where output column q % OW reads inside its row at kernel column kw. Periodic
  // in q with period W * OW, a multiple of the vector width: a block at q0 reads it from
  // q0 % (W * OW), so one period and a block's length are enough.
  const int64_t period = W * OW, mask_s = period + slack;
  std::vector<int32_t> mask(static_cast<size_t>(KW * mask_s));
  std::vector<char> whole(static_cast<size_t>(KW));  // column kw inside the row for every ow
  for (int64_t kw = 0; kw < KW; ++kw) {
    const int64_t shift = kw * dw - pw;
    whole[kw] = shift >= 0 && shift + OW <= Wd;
    int32_t* m = mask.data() + kw * mask_s;
    for (int64_t q = 0, ow = 0; q < mask_s; ++q) {
      m[q] = ow + shift >= 0 && ow + shift < Wd ? -1 : 0;
      if (++ow == OW) ow = 0;
    }
  }
  const bool flat_in = pb.li.strides[3] == 1 && pb.li.strides[2] == Wd;
  const bool flat_out = pb.lo.strides[3] == 1 && pb.lo.strides[2] == OW;
  const bool flat_w = pb.lw.strides[3] == 1 && pb.lw.strides[2] == KW;  // a channel's taps contiguous
  // Blocks of 4 vectors, the last 1-3 as one block of 2 or 4 (into the slack). The blocks that
  // end inside a flat output plane are written straight into it: [0, in_place); the rest go
  // through `sums` and are copied.
  const auto block_len = [&](int64_t q0) { return LP - q0 > 2 * W ? 4 * W : 2 * W; };
  int64_t in_place = 0;
  while (flat_out && in_place < LP && in_place + block_len(in_place) <= P) in_place += block_len(in_place);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / C, c = t % C;
    const float* src = pb.in + n * pb.li.strides[0] + c * pb.li.strides[1];
    float* dst = pb.out + n * pb.lo.strides[0] + c * pb.lo.strides[1];
    if (flat_in) {
      copy_row<W>(buf.data() + A, src, H * Wd);  // inline: a libc call per small plane was 12% of a 6x6 map's time
    } else {
      for (int64_t ih = 0; ih < H; ++ih)
        for (int64_t iw = 0; iw < Wd; ++iw) buf[A + ih * Wd + iw] = src[ih * pb.li.strides[2] + iw * pb.li.strides[3]];
    }
    // the per-channel scale folded into the weights, the bias as the sums' seed (as direct_planes)
    const float s = pb.scale ? pb.scale[c * pb.scale_s] : 1.0f;
    const float* wk = pb.w + c * pb.lw.strides[0];
    if (flat_w) {  // one short loop GCC unrolls (with the strides it was 14% of a 6x6 map's time)
      for (int64_t k = 0; k < KH * KW; ++k) wl[k] = wk[k] * s;
    } else {
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) wl[kh * KW + kw] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
    }
    const float seed = pb.bias ? pb.bias[c * pb.bias_s] : 0.0f;
    for (int64_t q0 = 0; q0 < LP;) {
      const float* x = buf.data() + q0;  // tap (kh, kw) at x + kh * dh * Wd + kw * dw (A folded in)
      const int64_t len = block_len(q0);
      float* to = q0 < in_place ? dst : sums.data();
      if (len == 4 * W) {
        flat_block<W, 4>(x, KH, KW, dh * Wd, dw, wl.data(), mask.data() + q0 % period, mask_s, whole.data(), seed, lo_v, hi_v,
                         to + q0);
      } else {
        flat_block<W, 2>(x, KH, KW, dh * Wd, dw, wl.data(), mask.data() + q0 % period, mask_s, whole.data(), seed, lo_v, hi_v,
                         to + q0);
      }
      q0 += len;
    }
    if (flat_out) {
      copy_row<W>(dst + in_place, sums.data() + in_place, P - in_place);
    } else {
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) dst[oh * pb.lo.strides[2] + ow * pb.lo.strides[3]] = sums[oh * OW + ow];
    }
  }
}

// Compiled once per library in core/kernels.cpp.
void depthwise_flat_baseline(const Problem& pb, int64_t t0, int64_t t1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_flat_avx2(const Problem& pb, int64_t t0, int64_t t1);
#endif
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_flat_baseline(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_flat<4>(pb, t0, t1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void depthwise_flat_avx2(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_flat<8>(pb, t0, t1);
}
#endif
#endif

// A depthwise conv (multiplier 1) with a square kernel at the same stride along both dims and
// no dilation, the sizes Micro::supports (arm::DepthwiseNeon: 3x3 and 5x5, stride 1 and 2), one
// plane per task: the plane is copied once into a zero-padded buffer (its border written once
// per call), then Micro::rows computes two output rows at a time from its rows, any padding
// and map size alike. Rows narrower than 4 or strided go through a small buffer.
template <class Micro>
ETFUSE_ALWAYS_INLINE void depthwise_rows(const Problem& pb, int64_t t0, int64_t t1) {
  const Params& p = pb.p;
  const int64_t C = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], K = pb.lw.sizes[2], S = p.stride[0];
  const int64_t ph = p.padding[0], pw = p.padding[1];
  const int64_t n = OW < 4 ? 4 : OW;  // the columns computed per row
  // a row's reads: n outputs' vectors, at stride 2 ld2 of 8 floats from column 2j + K - 1
  int64_t PW = S * n + K + 8;
  if (PW < Wd + 2 * pw) PW = Wd + 2 * pw;
  PW = (PW + 3) / 4 * 4;
  int64_t PH = (OH - 1) * S + K;
  if (PH < H + 2 * ph) PH = H + 2 * ph;
  std::vector<float> pad(static_cast<size_t>(PH * PW), 0.0f);
  const bool in_place = OW >= 4 && pb.lo.strides[3] == 1;
  std::vector<float> tmp(in_place ? 0 : static_cast<size_t>(2 * n));
  float lo_v, hi_v;
  clamp_bounds(p, lo_v, hi_v);
  const int act = p.has_max ? 2 : p.has_min ? 1 : 0;
  const auto one = Micro::template pick<1>(K, S, act), two = Micro::template pick<2>(K, S, act);
  float wl[28] = {};  // up to 5x5, whole vectors
  const int64_t ihs = pb.li.strides[2], iws = pb.li.strides[3];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t img = t / C, c = t % C;
    const float* src = pb.in + img * pb.li.strides[0] + c * pb.li.strides[1];
    float* dst = pb.out + img * pb.lo.strides[0] + c * pb.lo.strides[1];
    for (int64_t ih = 0; ih < H; ++ih) {
      float* d = pad.data() + (ih + ph) * PW + pw;
      if (iws == 1) {
        copy_row<4>(d, src + ih * ihs, Wd);
      } else {
        for (int64_t iw = 0; iw < Wd; ++iw) d[iw] = src[ih * ihs + iw * iws];
      }
    }
    // the per-channel scale folded into the weights, the bias as the sums' seed (as direct_planes)
    const float s = pb.scale ? pb.scale[c * pb.scale_s] : 1.0f;
    const float* wk = pb.w + c * pb.lw.strides[0];
    for (int64_t kh = 0; kh < K; ++kh)
      for (int64_t kw = 0; kw < K; ++kw) wl[kh * K + kw] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
    const float seed = pb.bias ? pb.bias[c * pb.bias_s] : 0.0f;
    for (int64_t oh = 0; oh < OH; oh += 2) {
      const int64_t R = OH - oh < 2 ? 1 : 2;
      const float* in = pad.data() + oh * S * PW;
      if (in_place) {
        (R == 2 ? two : one)(in, PW, wl, seed, lo_v, hi_v, dst + oh * pb.lo.strides[2], pb.lo.strides[2], n);
        continue;
      }
      (R == 2 ? two : one)(in, PW, wl, seed, lo_v, hi_v, tmp.data(), n, n);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t ow = 0; ow < OW; ++ow) dst[(oh + r) * pb.lo.strides[2] + ow * pb.lo.strides[3]] = tmp[r * n + ow];
    }
  }
}

#if ETFUSE_HAVE_ARM_NEON
void depthwise_rows_neon(const Problem& pb, int64_t t0, int64_t t1);
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_rows_neon(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_rows<arm::DepthwiseNeon>(pb, t0, t1);
}
#endif

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

// The GEMM's output side for output channels co0... of image n, with the per-channel scale, bias
// and clamp: C(co, p) = out[n, co0 + co, p] (a row per channel: the implicit GEMM, the phase
// planes) or, `transposed`, C(p, co) (run_small_map, run_packed). Pixel p at p * stride(3): a
// flat plane, checked by the caller (out_is_flat).
inline void channels_out(const Problem& pb, int64_t n, int64_t co0, bool transposed, gemm::Args& a) {
  const Params& p = pb.p;
  const int64_t along_channels = pb.lo.strides[1], along_pixels = pb.lo.strides[3];
  a.C = pb.out + n * pb.lo.strides[0] + co0 * along_channels;
  a.c_rs = transposed ? along_pixels : along_channels;
  a.c_cs = transposed ? along_channels : along_pixels;
  a.bias = pb.bias ? pb.bias + co0 * pb.bias_s : nullptr;
  a.bias_rs = transposed ? 0 : pb.bias_s;
  a.bias_cs = transposed ? pb.bias_s : 0;
  a.scale = pb.scale ? pb.scale + co0 * pb.scale_s : nullptr;
  a.scale_rs = transposed ? 0 : pb.scale_s;
  a.scale_cs = transposed ? pb.scale_s : 0;
  a.clamp = p.has_min || p.has_max;
  clamp_bounds(p, a.act_min, a.act_max);
  if (pb.residual) {  // laid out as out (Problem::residual)
    a.residual = pb.residual + (a.C - pb.out);
    a.residual_rs = a.c_rs;
    a.residual_cs = a.c_cs;
  }
}

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

constexpr int64_t kDirectNeonRows = 12;  // Kernels::direct_rows on NEON

// conv2d's kernels on one ISA: the one place they are chosen. A null entry is a path that ISA
// does not take (run_paths goes on to the next).
struct Kernels {
  void (*direct)(const Problem&, int64_t, int64_t, const float*);
  void (*depthwise_flat)(const Problem&, int64_t, int64_t);
  void (*depthwise_channels)(const Problem&, int64_t, int64_t);
  int64_t channels_width;                                      // depthwise_channels' vector width
  void (*depthwise_rows)(const Problem&, int64_t, int64_t);    // NEON
  void (*depthwise_blocks)(const Problem&, int64_t, int64_t);  // AVX-512, NEON
#if ETFUSE_HAVE_X86_DISPATCH
  // run_phase_gemm's tile loop and phase split, its panel width and rows (AVX2 and up)
  void (*tap_panels)(const TapTask&, int64_t, int64_t) = nullptr;
  void (*split_rows)(const Problem&, const PhaseGeom&, int64_t, int64_t, float*, const PhaseRows&) = nullptr;
  int64_t tap_nr = 0, tap_mr = 0;
#endif
  // Spatial convs (groups 1) whose output rows are at least this wide take `direct` whatever
  // their channels (0: only is_direct's few-channel ones). NEON's 8-plane blocks are a GEMM
  // tile that reads B in place from the phase planes: no window packing. Measured on
  // neoverse-n1 (instructions per call, implicit GEMM -> direct): 32 -> 64 stride 2 on 64x64
  // 8.26 -> 7.19 M, 16 -> 64 on 55x55 12.4 -> 10.4, 32 -> 128 on 27x27 12.8 -> 10.3, 48 -> 192 on
  // 13x13 6.58 -> 6.32, 64 -> 64 on 24x24 9.28 -> 8.18, 128 -> 128 on 12x12 10.97 -> 9.49, a 7x7
  // stride-2 stem to 48x48 9.66 -> 8.30; on 8x8 the dropped columns (2 of 10) lose (64 -> 64:
  // 1.27 -> 1.31), 16x16 is even (64 -> 128: 7.75 vs 7.81).
  int64_t direct_rows = 0;
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
      return {&direct_avx2, &depthwise_flat_avx2, &depthwise_channels_avx512, 16, nullptr, &depthwise_blocks_avx512,
              &tap_panels_avx512, &split_rows_avx512, kTapPanelAvx512, kTapRowsAvx512};
    case Isa::kAvx2:
      return {&direct_avx2, &depthwise_flat_avx2, &depthwise_channels_avx2, 8, nullptr, nullptr,
              &tap_panels_avx2, &split_rows_avx2, kTapPanelAvx2, kTapRowsAvx2};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon:
      return {&direct_neon, &depthwise_flat_baseline, &depthwise_channels_baseline, 4, &depthwise_rows_neon,
              &depthwise_blocks_neon, kDirectNeonRows};
#endif
    default:
      return {&direct_baseline, &depthwise_flat_baseline, &depthwise_channels_baseline, 4, nullptr, nullptr};
  }
}

#if ETFUSE_HAVE_X86_DISPATCH

// A phase-plane GEMM task's input: the phase rows it reads, split by its own thread into this
// buffer. `call` names the (call, image, group) whose whole planes it holds (a channel block's
// task; 0: none), so a thread's second task of the same call does not split them again.
struct PhaseBuffer {
  std::vector<float> data;
  std::vector<const float*> tap;
  uint64_t call = 0;
};

// Below this many column panels the tasks are blocks of output channels over the whole map,
// from it bands of output rows. Bands compute more dropped columns (a band's last panel) and
// each task splits only its rows; blocks split the whole map, once per thread. Measured on
// ResNet8 on the runtime, 2 threads (us a forward, three runs): bands from 16 panels (its 16x16
// maps have 9) 217 226 216, bands everywhere 212 244 229, blocks everywhere 220 217 193. Maps
// from 64 panels (ResNet-18's 56x56 at 224) take bands: a thread's rows stay in its L2.
constexpr int64_t kPhaseBandPanels = 64;

// Runs the whole phase-plane GEMM, image by image and group by group, as parallel tasks that
// each split the input rows they read (with the padding) into their own thread's buffer, then
// run their panels: a band of output rows with every output channel or, on a map of few
// panels, a block of output channels with every row. Split once by the calling thread, the
// other thread's panels read every phase line out of the caller's cache, a miss in the middle
// of the multiply-adds: ResNet8's 16 -> 16 on 32x32 took 33 us on one thread and 41 on two.
// Bands also keep a thread on the rows it wrote in the op before (the pool deals its chunks
// out in order, the first ones to the calling thread).
template <class Par>
inline void run_phase_gemm(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], OH = pb.lo.sizes[2];
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = pb.lo.sizes[1] / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = Cg * KH * KW;
  const PhaseGeom geom(pb);
  const Kernels kern = kernels(selected_isa());
  const int64_t NR = kern.tap_nr, MR = kern.tap_mr;
  const int64_t panels = (OH * geom.SW + NR - 1) / NR, tiles = (Mg + MR - 1) / MR;
  const bool by_rows = panels >= kPhaseBandPanels || tiles < 2;
  const int64_t phases = p.stride[0] * p.stride[1];
  // About 256 KFLOP per parallel chunk, as gemm::run
  const int64_t flop = int64_t(1) << 18, per_row = 2 * Mg * K * geom.SW, per_tile = 2 * MR * K * OH * geom.SW;
  const int64_t grain = std::max<int64_t>(1, flop / (by_rows ? per_row : per_tile));
  const auto fn = kern.tap_panels;
  const auto split = kern.split_rows;
  static std::atomic<uint64_t> calls{0};
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
      const float* w = pb.w + g * Mg * pb.lw.strides[0];
      // output rows [oh0, oh1), output channels [m0, m1) of the group
      const auto task = [&](int64_t oh0, int64_t oh1, int64_t m0, int64_t m1) {
        thread_local PhaseBuffer buf;
        const int64_t rows = oh1 - oh0 + geom.reach, plane = rows * geom.SW, channel = phases * plane;
        if (by_rows || buf.call != call) {
          const size_t size = static_cast<size_t>(Cg * channel + NR + geom.SW);  // the last panel reads past
          if (buf.data.size() < size) buf.data.resize(size);
          split(pb, geom, n, g, buf.data.data(), PhaseRows{oh0, oh0 + rows, plane, channel, true});
          std::fill(buf.data.data() + Cg * channel, buf.data.data() + size, 0.0f);
          buf.tap.resize(static_cast<size_t>(K));
          geom.taps(pb, buf.data.data(), buf.tap.data(), plane, channel);
          buf.call = by_rows ? 0 : call;
        }
        const int64_t Q = (oh1 - oh0) * geom.SW;
        const TapTask t{&pb, buf.tap.data(), w + m0 * pb.lw.strides[0], pb.lw.strides[0], K, m1 - m0, g * Mg + m0, n, geom.SW, Q, oh0};
        fn(t, 0, (Q + NR - 1) / NR);
      };
      if (by_rows) {
        serial_or_parallel(OH, grain, par, [&](int64_t b, int64_t e) { task(b, e, 0, Mg); });
      } else {
        serial_or_parallel(tiles, grain, par, [&](int64_t b, int64_t e) { task(0, OH, b * MR, std::min(e * MR, Mg)); });
      }
    }
  }
}
#endif  // ETFUSE_HAVE_X86_DISPATCH

// A small output map (a network's last stages: 7x7, 6x6, 3x3, 1x1) whose pixels fill the
// implicit GEMM's NR-wide panels badly (9 of 16 columns on a 3x3 map with AVX2) runs as the
// GEMM's dot-product path on the transposed problem instead:
//   out^T[p, co] = sum_k cols[p, k] * weight[co, k]
// where cols is the im2col of the image, pixel by pixel (P x K floats, small). Both operands are
// contiguous along k and the weight is read once. Measured on AVX2 (GFLOP/s, dot vs panels):
// P=9 K=320 22.7 vs 17.3, P=36 K=384 24.6 vs 21.1, P=49 K=960 28.5 vs 25.4; full panels
// (P=16, 64) and short K stay with the panels (P=16 K=256 22.6 vs 32.9, P=36 K=64 12.2 vs 19.4).
constexpr int64_t kSmallMapPixels = 64;

inline bool small_map(int64_t pixels, int64_t K) {
  const int64_t nr = gemm::detail::kernels(selected_isa()).tiles.nr;
  const int64_t padded = (pixels + nr - 1) / nr * nr;
  const bool sparse = pixels * 5 <= padded * 4;  // at most 80% of the panel columns used
  return pixels <= kSmallMapPixels && sparse && (K >= 128 || pixels * 2 <= padded);
}

// cols[p, k] = input[ci, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw] (zero outside), with
// p = oh * OW + ow and k = (ci * KH + kh) * KW + kw.
inline void im2col_rows(const Problem& pb, const float* in, int64_t Cg, float* cols) {
  const Params& p = pb.p;
  const int64_t OH = pb.lo.sizes[2], OW = pb.lo.sizes[3], H = pb.li.sizes[2], Wd = pb.li.sizes[3];
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = Cg * KH * KW;
  const int64_t hs = pb.li.strides[2], ws = pb.li.strides[3];
  // one k at a time, every pixel: the bounds are worked out once per (k, output row), not per
  // element (per element, this copy took longer than the GEMM after it on 5x5 maps)
  for (int64_t ci = 0; ci < Cg; ++ci) {
    const float* plane = in + ci * pb.li.strides[1];
    for (int64_t kh = 0; kh < KH; ++kh) {
      for (int64_t kw = 0; kw < KW; ++kw) {
        float* col = cols + (ci * KH + kh) * KW + kw;
        const int64_t iw0 = kw * p.dilation[1] - p.padding[1];
        int64_t lo, hi;
        valid_range(iw0, p.stride[1], Wd, OW, lo, hi);
        for (int64_t oh = 0; oh < OH; ++oh) {
          float* dst = col + oh * OW * K;
          const int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
          if (ih < 0 || ih >= H) {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow * K] = 0.0f;
            continue;
          }
          const float* row = plane + ih * hs + iw0 * ws;
          const int64_t step = p.stride[1] * ws;
          for (int64_t ow = 0; ow < lo; ++ow) dst[ow * K] = 0.0f;
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow * K] = row[ow * step];
          for (int64_t ow = hi; ow < OW; ++ow) dst[ow * K] = 0.0f;
        }
      }
    }
  }
}

template <class Par>
inline void run_small_map(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], P = pb.lo.sizes[2] * pb.lo.sizes[3];
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = Cout / G;
  const int64_t K = Cg * pb.lw.sizes[2] * pb.lw.sizes[3];
  std::vector<float> cols(static_cast<size_t>(P * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      im2col_rows(pb, pb.in + n * pb.li.strides[0] + g * Cg * pb.li.strides[1], Cg, cols.data());
      gemm::Args a;
      a.M = P;
      a.N = Mg;
      a.K = K;
      a.A = cols.data();
      a.a_rs = K;
      a.a_cs = 1;
      a.B = pb.w + g * Mg * pb.lw.strides[0];  // B(k, co) = weight[co, k]
      a.b_rs = 1;
      a.b_cs = pb.lw.strides[0];
      channels_out(pb, n, g * Mg, true, a);
      a.dot = true;
      gemm::run(a, par);
    }
  }
}

// A weight packed at fuse time (groups 1): the transposed problem on the GEMM's tiles with the
// packed weight as B, read in place,
//   out^T[p, co] = sum_k cols[p, k] * weight[co, k]
// where cols is the input itself for a 1x1, stride-1, unpadded conv on a flat plane (read
// through its strides: A(p, ci) = input[ci, p]), the image's im2col otherwise. Nothing of the
// weight is copied per call: the per-call packing of the other paths is what makes a small map's
// 1x1 conv slow there (MobileNetV2's 160 -> 960 on 3x3).
template <class Par>
inline void run_packed(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], P = pb.lo.sizes[2] * pb.lo.sizes[3];
  const int64_t C = pb.li.sizes[1], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3], K = C * KH * KW;
  const bool in_place = KH == 1 && KW == 1 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 0 &&
      p.padding[1] == 0 && (pb.li.sizes[2] <= 1 || pb.li.strides[2] == pb.li.sizes[3] * pb.li.strides[3]);
  std::vector<float> cols(in_place ? 0 : static_cast<size_t>(P * K));
  for (int64_t n = 0; n < N; ++n) {
    const float* in = pb.in + n * pb.li.strides[0];
    gemm::Args a;
    a.M = P;
    a.N = Cout;
    a.K = K;
    if (in_place) {
      a.A = in;
      a.a_rs = pb.li.strides[3];
      a.a_cs = pb.li.strides[1];
    } else {
      im2col_rows(pb, in, C, cols.data());
      a.A = cols.data();
      a.a_rs = K;
      a.a_cs = 1;
    }
    a.packed_b = pb.packed;
    a.packed_b_i8 = pb.packed_i8;
    channels_out(pb, n, 0, true, a);
    gemm::run(a, par);
  }
}

// out = clamp(out + residual) element by element, for the paths that do not add the residual in
// their epilogue (adds_residual): a skip connection around a depthwise conv, or any conv on the
// SSE2 baseline's direct kernel. The conv ran without its clamp.
inline void add_residual(const Problem& pb) {
  const Params& p = pb.p;
  float lo, hi;
  clamp_bounds(p, lo, hi);
  const Layout& l = pb.lo;
  for (int64_t n = 0; n < l.sizes[0]; ++n) {
    for (int64_t c = 0; c < l.sizes[1]; ++c) {
      for (int64_t h = 0; h < l.sizes[2]; ++h) {
        const int64_t at = n * l.strides[0] + c * l.strides[1] + h * l.strides[2];
        float* o = pb.out + at;
        const float* r = pb.residual + at;
        for (int64_t w = 0, ws = l.strides[3]; w < l.sizes[3]; ++w) o[w * ws] = gemm::clamp_act(o[w * ws] + r[w * ws], lo, hi);
      }
    }
  }
}

}  // namespace detail

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
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = Cout / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  if (detail::small_map(OH * OW, Cg * KH * KW)) {
    detail::run_small_map(pb, par);
    return;
  }
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
