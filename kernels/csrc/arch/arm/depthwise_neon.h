// aarch64 NEON microkernels of the float depthwise conv (core/conv2d.h, detail::depthwise_rows):
// R output rows of one channel, K x K taps (3 or 5) at stride S (1 or 2), from rows of a
// zero-padded copy of the input plane. Each tap is one fmla by lane (the weights sit in q
// registers, 4 taps each); the input rows are read with unaligned loads (stride 1: ldp of two
// vectors, per kernel column) or de-interleaved (stride 2: ld2 gives the even and odd
// columns), so there are no shuffles and no per-element index math. Two output rows share
// their input rows (R = 2: 4 rows of loads for 2 x 3 rows of taps at K = 3, stride 1).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <utility>

#include "core/common.h"

namespace etfuse {
namespace core {
namespace conv2d {
namespace arm {

template <int... I, class F>
ETFUSE_ALWAYS_INLINE void static_for_impl(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}
// f(integral_constant<int, 0>) ... f(integral_constant<int, N - 1>): lane numbers must be constants
template <int N, class F>
ETFUSE_ALWAYS_INLINE void static_for(F&& f) {
  static_for_impl(std::make_integer_sequence<int, N>{}, f);
}

// The output clamp: kAct 0 none, 1 max(lo, v) only (a relu), 2 both bounds. fmax / fmin return
// NaN for a NaN sum, as the portable clamp keeps it.
template <int kAct>
ETFUSE_ALWAYS_INLINE float32x4_t clamp4(float32x4_t v, float32x4_t lo, float32x4_t hi) {
  if constexpr (kAct >= 1) v = vmaxq_f32(v, lo);
  if constexpr (kAct == 2) v = vminq_f32(v, hi);
  return v;
}

// V vectors of 4 floats from p, one vld1q each: GCC pairs them into ldp / stp (with
// vld1q_f32_x4's 4-register tuples GCC 12 spilled every block's loads to the stack).
template <int V>
ETFUSE_ALWAYS_INLINE void load_vectors(const float* p, float32x4_t (&x)[V]) {
  for (int v = 0; v < V; ++v) x[v] = vld1q_f32(p + 4 * v);
}

template <int V>
ETFUSE_ALWAYS_INLINE void store_vectors(float* p, const float32x4_t (&x)[V]) {
  for (int v = 0; v < V; ++v) vst1q_f32(p + 4 * v, x[v]);
}

struct DepthwiseNeon {
  // out row r (< R), columns [j, j + 4V): clamp(bias + sum_{kh, kw} w[kh * K + kw] * in[(r * S + kh) * in_s + (j + c) * S + kw]).
  // w: the K * K weights in ceil(K * K / 4) vectors.
  template <int K, int S, int R, int V, int kAct>
  ETFUSE_ALWAYS_INLINE static void block(const float* in, int64_t in_s, const float32x4_t* w, float32x4_t vb,
                                         float32x4_t vlo, float32x4_t vhi, float* out, int64_t out_s, int64_t j) {
    float32x4_t acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = vb;
    // input row i feeds output row r at kernel row i - r * S
    static_for<(R - 1) * S + K>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      const float* row = in + i * in_s + j * S;
      // tap (kh, kw) of every output row this input row feeds, x = the input under column kw
      const auto taps = [&](auto kwc, const float32x4_t (&x)[V]) {
        constexpr int kw = decltype(kwc)::value;
        static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value, kh = i - r * S;
          if constexpr (kh >= 0 && kh < K) {
            constexpr int k = kh * K + kw;
            for (int v = 0; v < V; ++v) acc[r][v] = vfmaq_laneq_f32(acc[r][v], x[v], w[k / 4], k % 4);
          }
        });
      };
      if constexpr (S == 1) {
        static_for<K>([&](auto kwc) {
          float32x4_t x[V];
          load_vectors<V>(row + decltype(kwc)::value, x);
          taps(kwc, x);
        });
      } else {
        // ld2 at column 2m: the even columns (kw = 2m) and the odd ones (kw = 2m + 1)
        static_for<(K + 1) / 2>([&](auto mc) {
          constexpr int m = decltype(mc)::value;
          float32x4_t even[V], odd[V];
          for (int v = 0; v < V; ++v) {
            const float32x4x2_t t = vld2q_f32(row + 2 * m + 8 * v);
            even[v] = t.val[0];
            odd[v] = t.val[1];
          }
          taps(std::integral_constant<int, 2 * m>{}, even);
          if constexpr (2 * m + 1 < K) taps(std::integral_constant<int, 2 * m + 1>{}, odd);
        });
      }
    });
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < V; ++v) acc[r][v] = clamp4<kAct>(acc[r][v], vlo, vhi);
      store_vectors<V>(out + r * out_s + j, acc[r]);
    }
  }

  // R rows of n >= 4 outputs: blocks of 16 columns, then of 4, the last one ending at n
  // (overlapping the one before: the same values written twice, no tail loop).
  template <int K, int S, int R, int kAct>
  static void rows(const float* in, int64_t in_s, const float* wl, float bias, float lo, float hi, float* out,
                   int64_t out_s, int64_t n) {
    float32x4_t w[(K * K + 3) / 4];
    for (int i = 0; i < (K * K + 3) / 4; ++i) w[i] = vld1q_f32(wl + 4 * i);
    const float32x4_t vb = vdupq_n_f32(bias), vlo = vdupq_n_f32(lo), vhi = vdupq_n_f32(hi);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) block<K, S, R, 4, kAct>(in, in_s, w, vb, vlo, vhi, out, out_s, j);
    for (; j + 4 <= n; j += 4) block<K, S, R, 1, kAct>(in, in_s, w, vb, vlo, vhi, out, out_s, j);
    if (j < n) block<K, S, R, 1, kAct>(in, in_s, w, vb, vlo, vhi, out, out_s, n - 4);
  }

  typedef void (*Rows)(const float*, int64_t, const float*, float, float, float, float*, int64_t, int64_t);
  static bool supports(int64_t K, int64_t S) { return (K == 3 || K == 5) && (S == 1 || S == 2); }
  // rows<K, S, R, kAct> for the run-time K, S (supports) and kAct
  template <int R>
  static Rows pick(int64_t K, int64_t S, int act) {
    static constexpr Rows table[2][2][3] = {
        {{&rows<3, 1, R, 0>, &rows<3, 1, R, 1>, &rows<3, 1, R, 2>}, {&rows<3, 2, R, 0>, &rows<3, 2, R, 1>, &rows<3, 2, R, 2>}},
        {{&rows<5, 1, R, 0>, &rows<5, 1, R, 1>, &rows<5, 1, R, 2>}, {&rows<5, 2, R, 0>, &rows<5, 2, R, 1>, &rows<5, 2, R, 2>}}};
    return table[K == 5][S == 2][act];
  }
};

// The direct conv's blocks (core/conv2d.h, detail::direct_planes) for several output planes:
// per tap one load of the planes' 4 weights (laid out [tap][4]), ld1 of the block's input
// vectors and an fmla by lane per plane and vector (the portable block loads each plane's
// weight apart and each input vector alone).
struct DirectNeon {
  static constexpr bool kLaneWeights = true;  // wl[k * 4 + p]
  template <int W, int U, int P>
  ETFUSE_ALWAYS_INLINE static void block(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                         const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
    static_assert(W == 4, "NEON vectors");
    float32x4_t r[P][U];
    for (int p = 0; p < P; ++p)
      for (int u = 0; u < U; ++u) r[p][u] = vdupq_n_f32(seed[p]);
    for (int64_t k = 0; k < taps; ++k) {
      const float32x4_t w = vld1q_f32(wl + 4 * k);
      float32x4_t x[U];
      load_vectors<U>(tap[k] + q, x);
      static_for<P>([&](auto pc) {
        for (int u = 0; u < U; ++u) r[decltype(pc)::value][u] = vfmaq_laneq_f32(r[decltype(pc)::value][u], x[u], w, decltype(pc)::value);
      });
    }
    const float32x4_t vlo = vdupq_n_f32(lo), vhi = vdupq_n_f32(hi);
    for (int p = 0; p < P; ++p) {
      for (int u = 0; u < U; ++u) r[p][u] = clamp4<2>(r[p][u], vlo, vhi);
      store_vectors<U>(acc + p * acc_s + q, r[p]);
    }
  }
};

}  // namespace arm
}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
