// etfuse pooling cores: max_pool2d (values only), avg_pool2d and the global mean over H, W, on
// NCHW (or CHW) float32 planes.
//
// One output row of a 2-D pool is a 1-D pool of the element-wise max (or sum) of the input rows
// its windows cover. So each output row first reduces its KH input rows into a padded row
// buffer (contiguous: vectorises), then reduces that buffer along the width, KW strided reads
// per output (stride 1 and 2 vectorise too). Planes are independent: the parallel loop runs
// over them, each task with its own row buffer.
//
// Semantics are torch's CPU kernels': max propagates NaN (a NaN anywhere in the window wins),
// padding never wins a max, output sizes and ceil_mode as in `pooling_output_shape`, avg_pool2d's
// divisor as in its CPU kernel (count_include_pad counts the padding inside H + pad, not past
// it; divisor_override replaces the count). Max is exact; sums are float32 in another order
// than torch's, so avg and mean agree to rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common.h"


namespace etfuse {
namespace core {
namespace pool2d {

struct Params {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
  // avg only
  bool count_include_pad = true;
  int64_t divisor = 0;  // 0: none (divisor_override unset)
};

// torch's pooling_output_shape for one dimension.
inline int64_t out_extent(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// Reads an int[2] argument (one value means both; empty means `fallback`, as for stride).
inline bool pair(const char* op, const char* name, const int64_t* v, size_t n, const int64_t* fallback, int64_t out[2],
                 Status& st) {
  if (n == 0 && fallback) {
    out[0] = fallback[0];
    out[1] = fallback[1];
    return true;
  }
  if (n != 1 && n != 2) return st.fail("%s: %s must have 1 or 2 values, got %zu", op, name, n);
  out[0] = v[0];
  out[1] = v[n - 1];
  return true;
}

// Validates the arguments against the input; gives the output shape (N, C, OH, OW or C, OH, OW).
inline bool out_shape(const char* op, const Layout& in, const Params& p, int& ndim, int64_t* sizes, Status& st) {
  if (in.ndim != 3 && in.ndim != 4) {
    return st.fail("%s: input must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape %s", op, ShapeStr(in).c_str());
  }
  for (int d = 0; d < 2; ++d) {
    if (p.kernel[d] <= 0 || p.stride[d] <= 0 || p.dilation[d] <= 0 || p.padding[d] < 0) {
      return st.fail("%s: kernel_size, stride and dilation must be positive and padding non-negative, got kernel "
                     "[%lld, %lld], stride [%lld, %lld], padding [%lld, %lld], dilation [%lld, %lld]",
                     op, (long long)p.kernel[0], (long long)p.kernel[1], (long long)p.stride[0],
                     (long long)p.stride[1], (long long)p.padding[0], (long long)p.padding[1],
                     (long long)p.dilation[0], (long long)p.dilation[1]);
    }
    if (p.padding[d] > p.kernel[d] / 2) {
      return st.fail("%s: padding should be at most half of the effective kernel size, got padding [%lld, %lld] "
                     "for kernel [%lld, %lld]", op, (long long)p.padding[0], (long long)p.padding[1],
                     (long long)p.kernel[0], (long long)p.kernel[1]);
    }
  }
  const int64_t h = in.size(-2), w = in.size(-1);
  const int64_t oh = out_extent(h, p.kernel[0], p.stride[0], p.padding[0], p.dilation[0], p.ceil_mode);
  const int64_t ow = out_extent(w, p.kernel[1], p.stride[1], p.padding[1], p.dilation[1], p.ceil_mode);
  if (oh < 1 || ow < 1) {
    return st.fail("%s: input %s is too small for kernel [%lld, %lld] with dilation [%lld, %lld] and padding "
                   "[%lld, %lld] (output %lldx%lld)", op, ShapeStr(in).c_str(), (long long)p.kernel[0],
                   (long long)p.kernel[1], (long long)p.dilation[0], (long long)p.dilation[1],
                   (long long)p.padding[0], (long long)p.padding[1], (long long)oh, (long long)ow);
  }
  ndim = in.ndim;
  for (int d = 0; d < ndim - 2; ++d) sizes[d] = in.sizes[d];
  sizes[ndim - 2] = oh;
  sizes[ndim - 1] = ow;
  return true;
}

// Global mean over the last two dims: the output shape, [.., 1, 1] with keepdim.
inline bool mean_shape(const char* op, const Layout& in, bool keepdim, int& ndim, int64_t* sizes, Status& st) {
  if (in.ndim < 2) return st.fail("%s: input must have at least 2 dimensions, got %s", op, ShapeStr(in).c_str());
  ndim = keepdim ? in.ndim : in.ndim - 2;
  for (int d = 0; d < in.ndim - 2; ++d) sizes[d] = in.sizes[d];
  if (keepdim) sizes[ndim - 2] = sizes[ndim - 1] = 1;
  return true;
}

namespace detail {

// torch's max: the new value wins when greater or NaN (so a NaN, once in, stays).
ETFUSE_ALWAYS_INLINE float max_nan(float acc, float v) {
  return (v > acc || v != v) ? v : acc;
}

struct Plane {
  int64_t h, w, oh, ow;
};

// One plane of max_pool2d. `row`: a buffer of `row_len(...)` floats, its padding at -inf.
template <bool kMax>
ETFUSE_ALWAYS_INLINE void pool_plane(const float* in, float* out, const Plane& g, const Params& p, float* row) {
  const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
  const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
  float* body = row + pw;
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t y0 = oy * sh - ph;
    int64_t rows = 0;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t y = y0 + ky * dh;
      if (y < 0 || y >= g.h) continue;
      const float* src = in + y * g.w;
      if (rows++ == 0) {
        for (int64_t x = 0; x < g.w; ++x) body[x] = src[x];
      } else if (kMax) {
        for (int64_t x = 0; x < g.w; ++x) body[x] = max_nan(body[x], src[x]);
      } else {
        for (int64_t x = 0; x < g.w; ++x) body[x] += src[x];
      }
    }
    if (rows == 0) {  // only with ceil_mode on a window in the padding: nothing to pool
      const float fill = kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
      for (int64_t x = 0; x < g.w; ++x) body[x] = fill;
    }
    float* dst = out + oy * g.ow;
    for (int64_t ox = 0; ox < g.ow; ++ox) dst[ox] = row[ox * sw];
    for (int64_t kx = 1; kx < kw; ++kx) {
      const float* r = row + kx * dw;
      if (kMax) {
        for (int64_t ox = 0; ox < g.ow; ++ox) dst[ox] = max_nan(dst[ox], r[ox * sw]);
      } else {
        for (int64_t ox = 0; ox < g.ow; ++ox) dst[ox] += r[ox * sw];
      }
    }
    if (!kMax) {  // the divisor of each window (torch's avg_pool2d CPU kernel)
      const int64_t y1 = std::min(y0 + kh, g.h + ph);
      const int64_t ys = std::max<int64_t>(y0, 0), ye = std::min(y1, g.h);
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const int64_t x0 = ox * sw - pw;
        const int64_t x1 = std::min(x0 + kw, g.w + pw);
        int64_t div;
        if (p.divisor) {
          div = p.divisor;
        } else if (p.count_include_pad) {
          div = (y1 - y0) * (x1 - x0);
        } else {
          div = (ye - ys) * (std::min(x1, g.w) - std::max<int64_t>(x0, 0));
        }
        dst[ox] /= static_cast<float>(div);
      }
    }
  }
}

// avg_pool2d whose windows span whole rows (kernel width = input width, no padding, no
// dilation: DS-CNN's 24x5 window over a 25x5 map): each output is the sum of kh * w contiguous
// floats, the one-value-per-row path of pool_plane at 5 floats a row costs 10x more.
ETFUSE_ALWAYS_INLINE bool whole_row_windows(const Plane& g, const Params& p) {
  return p.kernel[1] == g.w && g.ow == 1 && p.padding[0] == 0 && p.padding[1] == 0 && p.dilation[0] == 1 &&
      p.dilation[1] == 1;
}

inline float plane_sum(const float* in, int64_t n) {
  // 8 partial sums: vectorises without reassociation flags, and rounds better than one chain
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += in[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += in[i];
  return s;
}

ETFUSE_ALWAYS_INLINE void avg_whole_rows(const float* in, float* out, const Plane& g, const Params& p) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t y0 = oy * p.stride[0], y1 = std::min(y0 + p.kernel[0], g.h);
    const int64_t div = p.divisor ? p.divisor : (y1 - y0) * g.w;  // torch's divisor, padding 0
    out[oy] = y1 > y0 ? plane_sum(in + y0 * g.w, (y1 - y0) * g.w) / static_cast<float>(div) : 0.0f;
  }
}

// max_pool2d on AVX-512 (and NEON, arch/arm/pool2d_neon.h) with stride 1 or 2 along the width and no dilation there (every
// network's 3x3 / 2x2 pools): pool_plane's two passes, 16 outputs a vector. Along the width,
// tap kx of 16 outputs at stride 2 is the even lanes of the 32 floats from row + 2 * ox + kx
// (one permute); the generic loop read them one by one (SqueezeNet's 64 x 47 x 47 pool: 108 us).
// `row` has kRowSlack floats past row_len for the last vector's reads.
constexpr int64_t kRowSlack = 64;
constexpr int64_t kMaxRows = 16;  // window heights it takes (the rows' pointers in registers)

// The rows of output row oy's windows that lie inside the plane, into src (at most kMaxRows);
// how many. The vector planes (AVX-512, NEON) reduce down them.
ETFUSE_ALWAYS_INLINE int window_rows(const float* plane, const Plane& g, const Params& p, int64_t oy,
                                     const float* (&src)[kMaxRows]) {
  int rows = 0;
  for (int64_t ky = 0, y = oy * p.stride[0] - p.padding[0]; ky < p.kernel[0]; ++ky, y += p.dilation[0]) {
    if (y >= 0 && y < g.h) src[rows++] = plane + y * g.w;
  }
  return rows;
}

}  // namespace detail

#if ETFUSE_HAVE_X86_DISPATCH
namespace x86 {
// Defined in arch/x86/pool2d_avx512.h.
ETFUSE_TARGET_AVX512 void max_planes_avx512(const float* in, float* out, const detail::Plane& g, const Params& p,
                                            int64_t row_len, int64_t q0, int64_t q1);
}  // namespace x86
#endif
#if ETFUSE_HAVE_ARM_NEON
namespace arm {
// Defined in arch/arm/pool2d_neon.h.
void max_planes_neon(const float* in, float* out, const detail::Plane& g, const Params& p, int64_t row_len, int64_t q0,
                     int64_t q1);
}  // namespace arm
#endif

namespace detail {

// Planes [q0, q1): the per-ISA entries below compile this body for their target.
template <bool kMax>
ETFUSE_ALWAYS_INLINE void pool_planes(const float* in, float* out, const Plane& g, const Params& p, int64_t row_len,
                                      int64_t q0, int64_t q1) {
  std::vector<float> row(static_cast<size_t>(row_len), kMax ? -std::numeric_limits<float>::infinity() : 0.0f);
  for (int64_t q = q0; q < q1; ++q) {
    if (!kMax && whole_row_windows(g, p)) {
      avg_whole_rows(in + q * g.h * g.w, out + q * g.oh, g, p);
    } else {
      pool_plane<kMax>(in + q * g.h * g.w, out + q * g.oh * g.ow, g, p, row.data());
    }
  }
}

template <bool kMax>
void planes_baseline(const float* in, float* out, const Plane& g, const Params& p, int64_t row_len, int64_t q0,
                     int64_t q1) {
  pool_planes<kMax>(in, out, g, p, row_len, q0, q1);
}

#if ETFUSE_HAVE_X86_DISPATCH
template <bool kMax>
ETFUSE_TARGET_AVX2 void planes_avx2(const float* in, float* out, const Plane& g, const Params& p, int64_t row_len,
                                    int64_t q0, int64_t q1) {
  pool_planes<kMax>(in, out, g, p, row_len, q0, q1);
}
#endif

// Pooling's kernels on one ISA: the one place they are chosen. `max_rows`: max pooling's
// AVX-512 or NEON planes, for the windows they take (see max_rows_fits); null elsewhere (there
// the portable planes).
using PlanesFn = void (*)(const float*, float*, const Plane&, const Params&, int64_t, int64_t, int64_t);
template <bool kMax>
struct Kernels {
  PlanesFn planes;
  PlanesFn max_rows;
};

template <bool kMax>
inline Kernels<kMax> kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512: return {&planes_avx2<kMax>, kMax ? &x86::max_planes_avx512 : nullptr};
    case Isa::kAvx2: return {&planes_avx2<kMax>, nullptr};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {&planes_baseline<kMax>, kMax ? &arm::max_planes_neon : nullptr};
#endif
    default: return {&planes_baseline<kMax>, nullptr};
  }
}

// Whether max_rows takes this window: strides 1 or 2 along the width, no dilation there, at
// most kMaxRows rows.
inline bool max_rows_fits(const Params& p) {
  return (p.stride[1] == 1 || p.stride[1] == 2) && p.dilation[1] == 1 && p.kernel[0] <= kMaxRows;
}

}  // namespace detail

// max_pool2d (kMax) or avg_pool2d over `planes` contiguous H x W planes of `in` into contiguous
// OH x OW planes of `out` (shapes from out_shape).
template <bool kMax, class Par>
inline void run(const float* in, float* out, int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                const Params& p, Par&& par) {
  if (planes == 0) return;
  const detail::Plane g{h, w, oh, ow};
  // the padded row: left padding, the input row, then whatever the last window reaches
  const int64_t reach = (ow - 1) * p.stride[1] + (p.kernel[1] - 1) * p.dilation[1] + 1;
  const int64_t row_len = std::max(p.padding[1] + w + p.padding[1], reach);
  const detail::Kernels<kMax> kern = detail::kernels<kMax>(selected_isa());
  const detail::PlanesFn fn = kern.max_rows && detail::max_rows_fits(p) ? kern.max_rows : kern.planes;
  const int64_t work = std::max<int64_t>(1, h * w * p.kernel[0] + oh * ow * p.kernel[1]);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / work);
  // serial for a small input as well, whatever the window: split, DS-CNN's 64 x 25 x 5 map (its
  // global average: 200 K adds) took 2.2 us against 0.9 on one thread, reading across cores
  if (planes * work <= kSerialElements || planes * h * w <= kSerialElements) {
    fn(in, out, g, p, row_len, 0, planes);
  } else {
    par(int64_t(0), planes, grain, [&](int64_t q0, int64_t q1) { fn(in, out, g, p, row_len, q0, q1); });
  }
}

// out[q] = mean of plane q (`planes` contiguous planes of `n` elements).
template <class Par>
inline void mean_planes(const float* in, float* out, int64_t planes, int64_t n, Par&& par) {
  auto body = [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      out[q] = n ? detail::plane_sum(in + q * n, n) / static_cast<float>(n) : std::numeric_limits<float>::quiet_NaN();
    }
  };
  if (planes * n <= kSerialElements) {
    body(0, planes);
  } else {
    par(int64_t(0), planes, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(n, 1)), body);
  }
}

}  // namespace pool2d
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_X86_DISPATCH && defined(ETFUSE_CORE_KERNELS)
#include "arch/x86/pool2d_avx512.h"
#endif
#if ETFUSE_HAVE_ARM_NEON && defined(ETFUSE_CORE_KERNELS)
#include "arch/arm/pool2d_neon.h"
#endif
