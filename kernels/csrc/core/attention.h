// Scaled dot-product attention (etfuse::sdpa), float32:
//
//   out[b, h, i, :] = sum_j softmax_j(scale * q[b, h, i, :] . k[b, g, j, :] + mask[b, h, i, j]) v[b, g, j, :]
//
// g = h / (H / Hk): k and v may have fewer heads than q (grouped-query attention, read in place
// instead of repeated).
// with the edge dialect's rule for a row whose scores are all -inf (every key masked): that row
// of out is 0, not NaN. q, k, v and the additive mask are read through their strides (a
// transposed or head-split view is read in place); the mask's strides are 0 along its broadcast
// dimensions; out is contiguous [B, H, L, Dv].
//
// Work is split over blocks of query rows of one (b, h); a block keeps its rows of scores (S
// floats each: never the L x S matrix of a head). Two paths:
//   - GEMM (L >= 8): blocks of 32 rows, scores and p @ v as two calls of the shared GEMM core
//     (gemm.h), the scale, mask and 1 / row sum in its epilogue;
//   - dot products (decoding, L < 8): blocks of 4 rows, each key row k[j] and value row v[j]
//     loaded once per block and used by its 4 queries, in vectors of W floats when the head
//     dimension is contiguous. Its per-ISA entry points are compiled once per library, in
//     core/kernels.cpp (-DETFUSE_CORE_KERNELS).
#pragma once

#include <cmath>
#include <vector>

#include "activation.h"  // exp_poly
#include "common.h"
#include "gemm.h"  // detail::Vec, hsum
#if ETFUSE_HAVE_ARM_NEON
#include "arch/arm/attention_neon.h"
#endif

namespace etfuse {
namespace core {
namespace attention {

struct Args {
  int64_t B = 0, H = 0, L = 0, S = 0, D = 0, Dv = 0;
  int64_t rep = 1;  // query heads per key/value head (grouped-query attention): head h reads k, v head h / rep
  const float* q = nullptr;
  int64_t q_s[4] = {0};  // strides of q [B, H, L, D]
  const float* k = nullptr;
  int64_t k_s[4] = {0};  // k [B, H, S, D]
  const float* v = nullptr;
  int64_t v_s[4] = {0};  // v [B, H, S, Dv]
  const float* mask = nullptr;  // null: no mask
  int64_t m_s[4] = {0};  // mask as [B, H, L, S], 0 along broadcast dimensions
  float scale = 1.0f;
  float* out = nullptr;  // contiguous [B, H, L, Dv]
};

constexpr int64_t kRows = 4;        // query rows per block on the dot-product path
constexpr int64_t kGemmRows = 32;   // query rows per block on the GEMM path
constexpr int64_t kGemmMinRows = 8;  // fewer query rows: the dot-product path

// The largest score of a row; `all_masked`: every score is -inf (or the row is empty), and the
// row's output is 0 (the edge dialect's rule).
inline float row_max(const float* s, int64_t n, bool& all_masked) {
  float m = -__builtin_inff();
  all_masked = true;
  for (int64_t j = 0; j < n; ++j) {
    all_masked = all_masked && s[j] == -__builtin_inff();
    m = s[j] > m ? s[j] : m;
  }
  return m;
}

// s[j] = exp(s[j] - m) (0 where s[j] is -inf) for j < n; returns their sum. Vectorised (the
// polynomial exp of activation.h): softmax's exp is most of attention's time at long sequences.
float exp_row_baseline(float* s, int64_t n, float m);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 float exp_row_avx2(float* s, int64_t n, float m);
#endif

// Query-row blocks [begin, end) of the flattened (b, h, block) index; `scratch` holds
// kRows * (S + Dv) floats.
void blocks_baseline(const Args& a, int64_t begin, int64_t end, float* scratch);
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 void blocks_avx2(const Args& a, int64_t begin, int64_t end, float* scratch);
#endif

// attention's kernels on one ISA: the one place they are chosen. NEON has its own exp; its
// blocks are the portable ones (their 4-float vectors are NEON vectors there).
struct Kernels {
  float (*exp_row)(float*, int64_t, float);
  void (*blocks)(const Args&, int64_t, int64_t, float*);
};

inline Kernels kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&exp_row_avx2, &blocks_avx2};
#endif
#if ETFUSE_HAVE_ARM_NEON
    case Isa::kNeonDot:
    case Isa::kNeon: return {&arm::exp_row, &blocks_baseline};
#endif
    default: return {&exp_row_baseline, &blocks_baseline};
  }
}

inline float exp_row(float* s, int64_t n, float m) { return kernels(selected_isa()).exp_row(s, n, m); }

#if defined(ETFUSE_CORE_KERNELS)
namespace detail {

using gemm::detail::Vec;

template <int W>
ETFUSE_ALWAYS_INLINE float dot(const float* x, int64_t xs, const float* y, int64_t ys, int64_t n) {
  typedef typename Vec<W>::type vf;
  int64_t d = 0;
  float sum = 0.0f;
  if (xs == 1 && ys == 1) {
    vf acc = vf{};
    for (; d + W <= n; d += W) {
      vf xv, yv;
      std::memcpy(&xv, x + d, sizeof(vf));
      std::memcpy(&yv, y + d, sizeof(vf));
      acc += xv * yv;
    }
    sum = gemm::detail::hsum<W>(acc);
  }
  for (; d < n; ++d) sum += x[d * xs] * y[d * ys];
  return sum;
}

// acc[0:n] += p * y[0:n] (y strided by ys)
template <int W>
ETFUSE_ALWAYS_INLINE void axpy(float* acc, float p, const float* y, int64_t ys, int64_t n) {
  typedef typename Vec<W>::type vf;
  int64_t d = 0;
  if (ys == 1) {
    const vf pv = vf{} + p;
    for (; d + W <= n; d += W) {
      vf av, yv;
      std::memcpy(&av, acc + d, sizeof(vf));
      std::memcpy(&yv, y + d, sizeof(vf));
      av += pv * yv;
      gemm::detail::store<W>(acc + d, av);
    }
  }
  for (; d < n; ++d) acc[d] += p * y[d * ys];
}

template <int W>
ETFUSE_ALWAYS_INLINE float exp_row(float* s, int64_t n, float m) {
  typedef typename Vec<W>::type vf;
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j] - m;
    const float e = activation::detail::exp_poly(x);
    s[j] = x < -87.3f ? 0.0f : e;  // exp of -inf is 0 exactly, as the portable softmax has it
  }
  vf acc = vf{};
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    vf v;
    std::memcpy(&v, s + j, sizeof(vf));
    acc += v;
  }
  float sum = gemm::detail::hsum<W>(acc);
  for (; j < n; ++j) sum += s[j];
  return sum;
}

template <int W>
ETFUSE_ALWAYS_INLINE void block(const Args& a, int64_t index, float* scratch) {
  const int64_t nblocks = (a.L + kRows - 1) / kRows;
  const int64_t bh = index / nblocks, i0 = (index % nblocks) * kRows;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t rows = a.L - i0 < kRows ? a.L - i0 : kRows;
  const float* qb = a.q + b * a.q_s[0] + h * a.q_s[1];
  const float* kb = a.k + b * a.k_s[0] + (h / a.rep) * a.k_s[1];
  const float* vb = a.v + b * a.v_s[0] + (h / a.rep) * a.v_s[1];
  const float* mb = a.mask ? a.mask + b * a.m_s[0] + h * a.m_s[1] : nullptr;
  float* scores = scratch;              // [rows][S]
  float* acc = scratch + kRows * a.S;   // [rows][Dv]
  // The keys some row of the block sees, [lo, hi): the scores, the softmax and p @ v skip the
  // keys the mask hides (-inf) at either end. A decoding step's causal mask hides every cache
  // slot past the current position: most of the cache early in a sequence.
  int64_t lo = 0, hi = a.S;
  if (mb) {
    lo = a.S, hi = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* mi = mb + (i0 + r) * a.m_s[2];
      int64_t j = 0;
      while (j < lo && mi[j * a.m_s[3]] == -__builtin_inff()) ++j;
      lo = j;
      j = a.S;
      while (j > hi && mi[(j - 1) * a.m_s[3]] == -__builtin_inff()) --j;
      hi = j;
    }
    if (hi < lo) hi = lo;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* qi = qb + (i0 + r) * a.q_s[2];
    float* s = scores + r * a.S;
    const float* mi = mb ? mb + (i0 + r) * a.m_s[2] : nullptr;
    for (int64_t j = lo; j < hi; ++j) {
      const float mj = mi ? mi[j * a.m_s[3]] : 0.0f;
      // a hidden key inside the range gets no dot product either (what k holds there is not read)
      s[j] = mj == -__builtin_inff() ? mj : a.scale * dot<W>(qi, a.q_s[3], kb + j * a.k_s[2], a.k_s[3], a.D) + mj;
    }
  }
  float inv[kRows];
  bool masked[kRows];
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * a.S + lo;
    bool all_inf;
    const float m = row_max(s, hi - lo, all_inf);
    masked[r] = all_inf;  // also S == 0: an empty softmax row is all-masked too
    inv[r] = 1.0f / exp_row<W>(s, hi - lo, m);
    float* ar = acc + r * a.Dv;
    for (int64_t d = 0; d < a.Dv; ++d) ar[d] = 0.0f;
  }
  for (int64_t j = lo; j < hi; ++j) {
    const float* vj = vb + j * a.v_s[2];
    for (int64_t r = 0; r < rows; ++r) {
      const float p = scores[r * a.S + j];
      if (p != 0.0f) axpy<W>(acc + r * a.Dv, p, vj, a.v_s[3], a.Dv);  // 0: a masked key
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = a.out + (bh * a.L + i0 + r) * a.Dv;
    const float* ar = acc + r * a.Dv;
    for (int64_t d = 0; d < a.Dv; ++d) o[d] = masked[r] ? 0.0f : ar[d] * inv[r];
  }
}

template <int W>
ETFUSE_ALWAYS_INLINE void blocks_impl(const Args& a, int64_t begin, int64_t end, float* scratch) {
  for (int64_t i = begin; i < end; ++i) block<W>(a, i, scratch);
}

}  // namespace detail

ETFUSE_NO_TRAPPING_MATH float exp_row_baseline(float* s, int64_t n, float m) {
  return detail::exp_row<4>(s, n, m);
}
void blocks_baseline(const Args& a, int64_t begin, int64_t end, float* scratch) {
  detail::blocks_impl<4>(a, begin, end, scratch);
}
#if ETFUSE_HAVE_X86_DISPATCH
ETFUSE_TARGET_AVX2 ETFUSE_NO_TRAPPING_MATH float exp_row_avx2(float* s, int64_t n, float m) {
  return detail::exp_row<8>(s, n, m);
}
ETFUSE_TARGET_AVX2 void blocks_avx2(const Args& a, int64_t begin, int64_t end, float* scratch) {
  detail::blocks_impl<8>(a, begin, end, scratch);
}
#endif
#endif

// Runs its range on the calling thread: the GEMMs inside one attention block (the blocks are
// what runs in parallel).
struct Serial {
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t, const F& fn) const {
    fn(begin, end);
  }
};

// One block of up to kGemmRows query rows of one (b, h) as two GEMMs of the shared core:
// scores = scale * q @ k^T + mask (the mask as the GEMM's bias), the softmax in place, then
// out = (p @ v) * (1 / row sum), the row scale as the GEMM's per-row scale (0 for an all-masked
// row). `scratch`: kGemmRows * S + kGemmRows floats.
inline void gemm_block(const Args& a, int64_t index, float* scratch) {
  const int64_t nblocks = (a.L + kGemmRows - 1) / kGemmRows;
  const int64_t bh = index / nblocks, i0 = (index % nblocks) * kGemmRows;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t rows = a.L - i0 < kGemmRows ? a.L - i0 : kGemmRows;
  float* p = scratch;                     // [rows][S]
  float* inv = scratch + kGemmRows * a.S;  // [rows]
  gemm::Args g;
  g.M = rows, g.N = a.S, g.K = a.D;
  g.A = a.q + b * a.q_s[0] + h * a.q_s[1] + i0 * a.q_s[2], g.a_rs = a.q_s[2], g.a_cs = a.q_s[3];
  g.B = a.k + b * a.k_s[0] + (h / a.rep) * a.k_s[1], g.b_rs = a.k_s[3], g.b_cs = a.k_s[2];  // k^T
  g.C = p, g.c_rs = a.S, g.c_cs = 1;
  g.scale = &a.scale;  // strides 0: one value
  if (a.mask) {
    g.bias = a.mask + b * a.m_s[0] + h * a.m_s[1] + i0 * a.m_s[2], g.bias_rs = a.m_s[2], g.bias_cs = a.m_s[3];
  }
  g.clamp = false;
  gemm::run(g, Serial{});
  for (int64_t r = 0; r < rows; ++r) {
    float* s = p + r * a.S;
    bool all_inf;
    const float m = row_max(s, a.S, all_inf);
    if (all_inf) {  // every key masked (or none): the row is 0
      for (int64_t j = 0; j < a.S; ++j) s[j] = 0.0f;
      inv[r] = 0.0f;
      continue;
    }
    inv[r] = 1.0f / exp_row(s, a.S, m);
  }
  gemm::Args o;
  o.M = rows, o.N = a.Dv, o.K = a.S;
  o.A = p, o.a_rs = a.S, o.a_cs = 1;
  o.B = a.v + b * a.v_s[0] + (h / a.rep) * a.v_s[1], o.b_rs = a.v_s[2], o.b_cs = a.v_s[3];
  o.C = a.out + (bh * a.L + i0) * a.Dv, o.c_rs = a.Dv, o.c_cs = 1;
  o.scale = inv, o.scale_rs = 1, o.scale_cs = 0;
  o.clamp = false;
  gemm::run(o, Serial{});
}

// Runs the attention described by `a` (validated by the caller).
template <class Par>
inline void run(const Args& a, Par&& par) {
  if (a.B * a.H * a.L * a.Dv == 0) return;
  if (a.L >= kGemmMinRows && a.S > 0 && a.D > 0) {
    const int64_t n = a.B * a.H * ((a.L + kGemmRows - 1) / kGemmRows);
    const size_t scratch = static_cast<size_t>(kGemmRows * (a.S + 1));
    par(0, n, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buf(scratch);
      for (int64_t i = begin; i < end; ++i) gemm_block(a, i, buf.data());
    });
    return;
  }
  const auto blocks = kernels(selected_isa()).blocks;
  const int64_t n = a.B * a.H * ((a.L + kRows - 1) / kRows);
  const size_t scratch = static_cast<size_t>(kRows * (a.S + a.Dv));
  // about 256 KFLOP per parallel chunk
  const int64_t flops = 2 * kRows * a.S * (a.D + a.Dv) + 1;
  int64_t grain = (int64_t(1) << 18) / flops;
  if (grain < 1) grain = 1;
  if (n <= grain) {
    std::vector<float> buf(scratch);
    blocks(a, 0, n, buf.data());
    return;
  }
  par(0, n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(scratch);
    blocks(a, begin, end, buf.data());
  });
}

}  // namespace attention
}  // namespace core
}  // namespace etfuse
