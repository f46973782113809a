// conv2d's shared pieces: the parameters and the problem (Params, Problem, out_shape), the
// parallel split (serial_or_parallel, grain_for), the row moves the algorithms share
// (valid_range, copy_row, zero_row) and the GEMM paths' output side (channels_out).
#pragma once

#include "core/common.h"
#include "core/gemm.h"

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

using gemm::detail::transpose_block;  // (gemm.h: the transposed problems' epilogue uses it too)

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

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
