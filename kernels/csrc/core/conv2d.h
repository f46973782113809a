// etfuse::conv2d_act.out core: out = clamp(conv2d(input, weight, bias), min, max), float32, NCHW.
//
// input [N, C, H, W], weight [Cout, C / groups, KH, KW], bias [Cout] or none; any stride,
// padding, dilation and groups; every operand read through its strides. Two algorithms:
//
// * depthwise (groups == C, one input channel per group): a direct kernel, one output plane per
//   task, each output row accumulated tap by tap in a row buffer (the stride-1 inner loop is a
//   contiguous multiply-add that GCC vectorises), then bias + clamp on the way out;
// * everything else: the shared GEMM per (image, group) with M = output channels, N = output
//   pixels, K = C / groups * KH * KW. No im2col buffer: the GEMM's B panels are packed straight
//   from the input windows (implicit GEMM, `gemm::Args::pack`), zeros for the padding; bias and
//   clamp run in the GEMM epilogue while the tile is in registers.
#pragma once

#include <vector>

#include "common.h"
#include "gemm.h"

namespace etfuse {
namespace core {
namespace conv2d {

struct Params {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  int64_t groups = 1;
  bool has_min = false, has_max = false;
  float min = 0.0f, max = 0.0f;
};

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
};

namespace detail {

// [lo, hi): the t in [0, n) with 0 <= base + t * step < limit (step >= 1).
ETFUSE_ALWAYS_INLINE void valid_range(int64_t base, int64_t step, int64_t limit, int64_t n, int64_t& lo, int64_t& hi) {
  lo = base >= 0 ? 0 : (-base + step - 1) / step;
  hi = base >= limit ? 0 : (limit - 1 - base) / step + 1;
  if (hi > n) hi = n;
  if (lo > hi) lo = hi;
}

struct PackCtx {
  const float* in;  // image n, first channel of the group
  int64_t cs, hs, ws, H, W, KH, KW, OW, sh, sw, ph, pw, dh, dw;
};

// B(k, j) = input[ci, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw] (zero outside), with
// k = (ci * KH + kh) * KW + kw and j = oh * OW + ow.
// Compiled once per library in core/kernels.cpp.
void pack_windows(const void* vctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack);
#if defined(ETFUSE_CORE_KERNELS)
void pack_windows(const void* vctx, int64_t k0, int64_t kc, int64_t j0, int64_t nr, int64_t NR, float* pack) {
  const PackCtx& c = *static_cast<const PackCtx*>(vctx);
  for (int64_t kk = 0; kk < kc; ++kk) {
    const int64_t k = k0 + kk, kw = k % c.KW, kh = (k / c.KW) % c.KH, ci = k / (c.KW * c.KH);
    const float* plane = c.in + ci * c.cs;
    float* dst = pack + kk * NR;
    int64_t oh = j0 / c.OW, ow = j0 % c.OW;
    for (int64_t jj = 0; jj < nr;) {
      const int64_t run = (nr - jj) < (c.OW - ow) ? (nr - jj) : (c.OW - ow);
      const int64_t ih = oh * c.sh - c.ph + kh * c.dh;
      float* d = dst + jj;
      if (ih < 0 || ih >= c.H) {
        for (int64_t t = 0; t < run; ++t) d[t] = 0.0f;
      } else {
        const float* row = plane + ih * c.hs;
        const int64_t iw0 = ow * c.sw - c.pw + kw * c.dw;
        int64_t lo, hi;
        valid_range(iw0, c.sw, c.W, run, lo, hi);
        for (int64_t t = 0; t < lo; ++t) d[t] = 0.0f;
        if (c.sw == 1 && c.ws == 1) {
          std::memcpy(d + lo, row + iw0 + lo, sizeof(float) * (hi - lo));
        } else {
          const int64_t step = c.sw * c.ws;
          const float* src = row + iw0 * c.ws;
          for (int64_t t = lo; t < hi; ++t) d[t] = src[t * step];
        }
        for (int64_t t = hi; t < run; ++t) d[t] = 0.0f;
      }
      jj += run;
      ow = 0;
      ++oh;
    }
    for (int64_t j = nr; j < NR; ++j) dst[j] = 0.0f;
  }
}
#endif

// Output planes [t0, t1) of a depthwise conv (plane t = image t / Cout, channel t % Cout).
// Each input plane is first copied into a zero-padded buffer, so every tap of every output
// column is a plain load; with unit stride a W-wide strip of an output row is accumulated in a
// register over all KH * KW taps.
template <int W>
ETFUSE_ALWAYS_INLINE void depthwise_planes(const Problem& pb, int64_t t0, int64_t t1) {
  typedef typename gemm::detail::Vec<W>::type vf;
  const Params& p = pb.p;
  const int64_t Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
  const int64_t mult = Cout / p.groups;
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t dh = p.dilation[0], dw = p.dilation[1];
  const int64_t ihs = pb.li.strides[2], iws = pb.li.strides[3];
  const float lo_v = p.has_min ? p.min : -__builtin_inff(), hi_v = p.has_max ? p.max : __builtin_inff();
  // Only the padded rows/columns some output reads are needed (stride may skip the end).
  const int64_t PH = (OH - 1) * sh + (KH - 1) * dh + 1, PW = (OW - 1) * sw + (KW - 1) * dw + 1;
  std::vector<float> buf(static_cast<size_t>(PH * PW + OW + KH * KW), 0.0f);
  float* __restrict padded = buf.data();
  float* __restrict acc = padded + PH * PW;
  float* __restrict wl = acc + OW;
  // Padded rows [r0, r1) and columns [c0, c1) hold input; the rest stays zero.
  const int64_t r0 = ph < PH ? ph : PH, r1 = (ph + H) < PH ? (ph + H) : PH;
  const int64_t c0 = pw < PW ? pw : PW, c1 = (pw + Wd) < PW ? (pw + Wd) : PW;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / Cout, co = t % Cout, ci = co / mult;
    const float* plane = pb.in + n * pb.li.strides[0] + ci * pb.li.strides[1];
    if (t == t0 || (t - 1) / mult != t / mult || mult == 1) {  // a new input plane
      for (int64_t r = r0; r < r1; ++r) {
        const float* src = plane + (r - ph) * ihs;
        float* dst = padded + r * PW;
        if (iws == 1) {
          std::memcpy(dst + c0, src + (c0 - pw), sizeof(float) * (c1 - c0));
        } else {
          for (int64_t c = c0; c < c1; ++c) dst[c] = src[(c - pw) * iws];
        }
      }
    }
    // The plane's weights are copied anyway: the per-channel scale is folded into the copy, so
    // clamp(conv(x, w) * s + b) costs what clamp(conv(x, w) + b) does.
    const float* wk = pb.w + co * pb.lw.strides[0];
    const float s = pb.scale ? pb.scale[co * pb.scale_s] : 1.0f;
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) wl[kh * KW + kw] = wk[kh * pb.lw.strides[2] + kw * pb.lw.strides[3]] * s;
    const float seed = pb.bias ? pb.bias[co * pb.bias_s] : 0.0f;  // the bias seeds the accumulator
    float* oplane = pb.out + n * pb.lo.strides[0] + co * pb.lo.strides[1];
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* top = padded + oh * sh * PW;
      int64_t x = 0;
      if (sw == 1) {
        for (; x + W <= OW; x += W) {
          vf a = vf{} + seed;
          for (int64_t kh = 0; kh < KH; ++kh) {
            const float* r = top + kh * dh * PW + x;
            const float* wr = wl + kh * KW;
            for (int64_t kw = 0; kw < KW; ++kw) {
              vf v;
              std::memcpy(&v, r + kw * dw, sizeof(vf));
              a += wr[kw] * v;
            }
          }
          std::memcpy(acc + x, &a, sizeof(vf));
        }
      }
      for (; x < OW; ++x) {
        float a = seed;
        for (int64_t kh = 0; kh < KH; ++kh) {
          const float* r = top + kh * dh * PW + x * sw;
          for (int64_t kw = 0; kw < KW; ++kw) a += wl[kh * KW + kw] * r[kw * dw];
        }
        acc[x] = a;
      }
      float* orow = oplane + oh * pb.lo.strides[2];
      const int64_t os = pb.lo.strides[3];
      if (os == 1) {
        for (int64_t i = 0; i < OW; ++i) orow[i] = gemm::clamp_act(acc[i], lo_v, hi_v);
      } else {
        for (int64_t i = 0; i < OW; ++i) orow[i * os] = gemm::clamp_act(acc[i], lo_v, hi_v);
      }
    }
  }
}

// Compiled once per library in core/kernels.cpp.
void depthwise_baseline(const Problem& pb, int64_t t0, int64_t t1);
ETFUSE_TARGET_AVX2 void depthwise_avx2(const Problem& pb, int64_t t0, int64_t t1);
#if defined(ETFUSE_CORE_KERNELS)
void depthwise_baseline(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_planes<4>(pb, t0, t1);
}
ETFUSE_TARGET_AVX2 void depthwise_avx2(const Problem& pb, int64_t t0, int64_t t1) {
  depthwise_planes<8>(pb, t0, t1);
}
#endif

}  // namespace detail

inline bool is_depthwise(const Problem& pb) {
  return pb.p.groups > 1 && pb.p.groups == pb.li.sizes[1] && pb.lw.sizes[1] == 1;
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
inline void run(const Problem& pb, Par&& par) {
  const Params& p = pb.p;
  const int64_t N = pb.lo.sizes[0], Cout = pb.lo.sizes[1], OH = pb.lo.sizes[2], OW = pb.lo.sizes[3];
  if (N == 0 || Cout == 0 || OH == 0 || OW == 0) return;
  if (is_depthwise(pb)) {
    const int64_t planes = N * Cout;
    const int64_t work = OH * OW * pb.lw.sizes[2] * pb.lw.sizes[3];
    int64_t grain = (int64_t(1) << 16) / (work > 0 ? work : 1);
    if (grain < 1) grain = 1;
    auto fn = selected_isa() == Isa::kAvx2 ? &detail::depthwise_avx2 : &detail::depthwise_baseline;
    if (planes <= grain) {
      fn(pb, 0, planes);
    } else {
      par(0, planes, grain, [&](int64_t b, int64_t e) { fn(pb, b, e); });
    }
    return;
  }
  const int64_t G = p.groups, Cg = pb.li.sizes[1] / G, Mg = Cout / G;
  const int64_t KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
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
      // out[n, g * Mg + i, oh, ow] with j = oh * OW + ow: one stride along j when the rows of
      // the output plane are contiguous (checked by the caller).
      a.C = pb.out + n * pb.lo.strides[0] + g * Mg * pb.lo.strides[1];
      a.c_rs = pb.lo.strides[1];
      a.c_cs = pb.lo.strides[3];
      a.bias = pb.bias ? pb.bias + g * Mg * pb.bias_s : nullptr;
      a.bias_rs = pb.bias_s;
      a.bias_cs = 0;
      a.scale = pb.scale ? pb.scale + g * Mg * pb.scale_s : nullptr;
      a.scale_rs = pb.scale_s;
      a.scale_cs = 0;
      a.clamp = p.has_min || p.has_max;
      a.act_min = p.has_min ? p.min : -__builtin_inff();
      a.act_max = p.has_max ? p.max : __builtin_inff();
      gemm::run(a, par);
    }
  }
}

// The GEMM path writes output pixel j = oh * OW + ow at j * stride(3): the output plane must
// be "flat" (stride(2) == OW * stride(3)). Depthwise handles any output strides.
inline bool out_is_flat(const Problem& pb) {
  return is_depthwise(pb) || pb.lo.sizes[2] <= 1 || pb.lo.strides[2] == pb.lo.sizes[3] * pb.lo.strides[3];
}

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
