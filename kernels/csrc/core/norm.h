// Norms over the last dimension, float32, rows contiguous. RMS norm (etfuse::rms_norm):
//
//   out[r, :] = (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)) * weight
//
// in the order llama's and transformers' RMSNorm compute it (normalise, then scale). One pass
// for the sum of squares (vectors of W floats), one for the output. Layer norm (etfuse::layer_norm):
//
//   out[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * weight + bias,  var biased (mean of squares)
//
// two passes for the statistics (the mean, then the squares of x - mean: no cancellation when the
// mean is large against the spread, as the one-pass sum of squares has), one for the output.
// The per-ISA entry points are compiled once per library, in core/kernels.cpp (-DETFUSE_CORE_KERNELS).
#pragma once

#include <cmath>

#include "common.h"
#include "gemm.h"  // detail::Vec, hsum
#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/norm_neon.h"
#endif

namespace etfuse {
namespace core {
namespace norm {

struct Args {
  int64_t rows = 0, n = 0;  // rows of n contiguous floats
  const float* x = nullptr;
  const float* weight = nullptr;  // n floats, or null (no scale)
  const float* bias = nullptr;    // layer norm: n floats, or null (no shift)
  float eps = 0.0f;
  float* out = nullptr;
};

void rows_baseline(const Args& a, int64_t r0, int64_t r1);
void layer_rows_baseline(const Args& a, int64_t r0, int64_t r1);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void rows_avx2(const Args& a, int64_t r0, int64_t r1);
ETFUSE_TARGET_AVX2 void layer_rows_avx2(const Args& a, int64_t r0, int64_t r1);
#endif
#if ETFUSE_HAVE_ARM_NEON
void rows_neon(const Args& a, int64_t r0, int64_t r1);
void layer_rows_neon(const Args& a, int64_t r0, int64_t r1);
#endif

#if defined(ETFUSE_CORE_KERNELS)
namespace detail {

template <int W>
ETFUSE_ALWAYS_INLINE void rows_impl(const Args& a, int64_t r0, int64_t r1) {
  typedef typename gemm::detail::Vec<W>::type vf;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.n;
    float* o = a.out + r * a.n;
    vf acc = vf{};
    int64_t j = 0;
    for (; j + W <= a.n; j += W) {
      vf v;
      std::memcpy(&v, x + j, sizeof(vf));
      acc += v * v;
    }
    float sum = gemm::detail::hsum<W>(acc);
    for (; j < a.n; ++j) sum += x[j] * x[j];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(a.n) + a.eps);
    if (a.weight) {
      for (j = 0; j < a.n; ++j) o[j] = (x[j] * inv) * a.weight[j];
    } else {
      for (j = 0; j < a.n; ++j) o[j] = x[j] * inv;
    }
  }
}

template <int W>
ETFUSE_ALWAYS_INLINE void layer_rows_impl(const Args& a, int64_t r0, int64_t r1) {
  typedef typename gemm::detail::Vec<W>::type vf;
  const int64_t n = a.n, nv = n - n % W;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * n;
    float* o = a.out + r * n;
    vf acc = vf{};
    for (int64_t j = 0; j < nv; j += W) {
      vf v;
      std::memcpy(&v, x + j, sizeof(vf));
      acc += v;
    }
    float sum = gemm::detail::hsum<W>(acc);
    for (int64_t j = nv; j < n; ++j) sum += x[j];
    const float mean = sum / static_cast<float>(n);
    acc = vf{};
    for (int64_t j = 0; j < nv; j += W) {
      vf v;
      std::memcpy(&v, x + j, sizeof(vf));
      v -= mean;
      acc += v * v;
    }
    float sq = gemm::detail::hsum<W>(acc);
    for (int64_t j = nv; j < n; ++j) sq += (x[j] - mean) * (x[j] - mean);
    const float inv = 1.0f / std::sqrt(sq / static_cast<float>(n) + a.eps);
    // the output in vectors; weight and bias each optional (nn.LayerNorm(bias=False), no affine)
    for (int64_t j = 0; j < nv; j += W) {
      vf v, w, b;
      std::memcpy(&v, x + j, sizeof(vf));
      v = (v - mean) * inv;
      if (a.weight) {
        std::memcpy(&w, a.weight + j, sizeof(vf));
        v *= w;
      }
      if (a.bias) {
        std::memcpy(&b, a.bias + j, sizeof(vf));
        v += b;
      }
      gemm::detail::store<W>(o + j, v);
    }
    for (int64_t j = nv; j < n; ++j) {
      float v = (x[j] - mean) * inv;
      if (a.weight) v *= a.weight[j];
      if (a.bias) v += a.bias[j];
      o[j] = v;
    }
  }
}

}  // namespace detail

void rows_baseline(const Args& a, int64_t r0, int64_t r1) {
  detail::rows_impl<4>(a, r0, r1);
}
void layer_rows_baseline(const Args& a, int64_t r0, int64_t r1) {
  detail::layer_rows_impl<4>(a, r0, r1);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void rows_avx2(const Args& a, int64_t r0, int64_t r1) {
  detail::rows_impl<8>(a, r0, r1);
}
ETFUSE_TARGET_AVX2 void layer_rows_avx2(const Args& a, int64_t r0, int64_t r1) {
  detail::layer_rows_impl<8>(a, r0, r1);
}
#endif
#if ETFUSE_HAVE_ARM_NEON
void rows_neon(const Args& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) arm::rms_row(a.x + r * a.n, a.n, a.weight, a.eps, a.out + r * a.n);
}
void layer_rows_neon(const Args& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) arm::layer_row(a.x + r * a.n, a.n, a.weight, a.bias, a.eps, a.out + r * a.n);
}
#endif
#endif

template <class Par>
inline void run_rows(const Args& a, void (*rows)(const Args&, int64_t, int64_t), Par&& par) {
  if (a.rows == 0 || a.n == 0) return;
  int64_t grain = (int64_t(1) << 16) / a.n;  // about 64K elements per chunk
  if (grain < 1) grain = 1;
  if (a.rows <= grain) {
    rows(a, 0, a.rows);
    return;
  }
  par(0, a.rows, grain, [&](int64_t begin, int64_t end) { rows(a, begin, end); });
}

// The norms' kernels on one ISA: the one place they are chosen (AVX-512 takes the AVX2 loops:
// the rows are bound by memory).
struct Kernels {
  void (*rows)(const Args&, int64_t, int64_t);        // RMS norm
  void (*layer_rows)(const Args&, int64_t, int64_t);  // layer norm
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&rows_avx2, &layer_rows_avx2};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {&rows_neon, &layer_rows_neon};
#endif
    default: return {&rows_baseline, &layer_rows_baseline};
  }
}

template <class Par>
inline void run(const Args& a, Par&& par) {
  run_rows(a, kernels(selected_isa()).rows, par);
}

template <class Par>
inline void run_layer(const Args& a, Par&& par) {
  run_rows(a, kernels(selected_isa()).layer_rows, par);
}

}  // namespace norm
}  // namespace core
}  // namespace etfuse
