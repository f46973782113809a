// aarch64 NEON microkernels of the float depthwise conv (core/conv2d/depthwise_rows.h, detail::depthwise_rows):
// R output rows of one channel, K x K taps (3 or 5) at stride S (1 or 2), from rows of a
// zero-padded copy of the input plane. Each tap is one fmla by lane (the weights sit in q
// registers, 4 taps each); the input rows are read with unaligned loads (stride 1: ldp of two
// vectors, per kernel column) or de-interleaved (stride 2: ld2 gives the even and odd
// columns), so there are no shuffles and no per-element index math. Two output rows share
// their input rows (R = 2: 4 rows of loads for 2 x 3 rows of taps at K = 3, stride 1).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
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

// DirectNeon's 8-plane blocks in assembly: the sums of plane p, vector u in v(8 + U * p + u), the
// taps' 3 (or 2) input vectors in v0-v2 (one ld1), two taps' weights in v3-v6 (one ld1 of 4).
#define ETFUSE_DN_FMLA3(a, b, c, w, l) \
  "fmla " #a ".4s, v0.4s, " #w ".s[" #l "]\n fmla " #b ".4s, v1.4s, " #w ".s[" #l "]\n fmla " #c ".4s, v2.4s, " #w ".s[" #l "]\n"
#define ETFUSE_DN_TAP3(lo4, hi4)                                                                           \
  ETFUSE_DN_FMLA3(v8, v9, v10, lo4, 0) ETFUSE_DN_FMLA3(v11, v12, v13, lo4, 1)                               \
  ETFUSE_DN_FMLA3(v14, v15, v16, lo4, 2) ETFUSE_DN_FMLA3(v17, v18, v19, lo4, 3)                             \
  ETFUSE_DN_FMLA3(v20, v21, v22, hi4, 0) ETFUSE_DN_FMLA3(v23, v24, v25, hi4, 1)                             \
  ETFUSE_DN_FMLA3(v26, v27, v28, hi4, 2) ETFUSE_DN_FMLA3(v29, v30, v31, hi4, 3)
#define ETFUSE_DN_FMLA2(a, b, w, l) "fmla " #a ".4s, v0.4s, " #w ".s[" #l "]\n fmla " #b ".4s, v1.4s, " #w ".s[" #l "]\n"
#define ETFUSE_DN_TAP2(lo4, hi4)                                                                                  \
  ETFUSE_DN_FMLA2(v8, v9, lo4, 0) ETFUSE_DN_FMLA2(v10, v11, lo4, 1) ETFUSE_DN_FMLA2(v12, v13, lo4, 2)             \
  ETFUSE_DN_FMLA2(v14, v15, lo4, 3) ETFUSE_DN_FMLA2(v16, v17, hi4, 0) ETFUSE_DN_FMLA2(v18, v19, hi4, 1)           \
  ETFUSE_DN_FMLA2(v20, v21, hi4, 2) ETFUSE_DN_FMLA2(v22, v23, hi4, 3)

// The direct conv's blocks (core/conv2d/direct_planes.h, detail::direct_planes) for up to 8 output planes, a
// GEMM tile whose B is read in place from the phase planes: per tap one load of the planes'
// weights (laid out [tap][8]: ldp of two vectors), U input vectors and an fmla by lane per plane
// and vector; two taps per loop step. 8 planes x 3 vectors keep 24 sums in registers: 24 fmla
// for 5 loads where 4 x 4 took 16 for 5 (and each tap's pointer step). 8 planes (every block of
// a conv with a multiple of 8 output channels) run block8's assembly, fewer the intrinsics.
struct DirectNeon {
  static constexpr bool kLaneWeights = true;  // wl[k * kPlanes + p]
  static constexpr int kPlanes = 8;
  template <int U, int P>
  ETFUSE_ALWAYS_INLINE static void tap_step(float32x4_t (&r)[P][U], const float* x0, const float* wk) {
    float32x4_t w[(P + 3) / 4];
    for (int i = 0; i < (P + 3) / 4; ++i) w[i] = vld1q_f32(wk + 4 * i);
    float32x4_t x[U];
    load_vectors<U>(x0, x);
    static_for<P>([&](auto pc) {
      constexpr int p = decltype(pc)::value;
      for (int u = 0; u < U; ++u) r[p][u] = vfmaq_laneq_f32(r[p][u], x[u], w[p / 4], p % 4);
    });
  }
  // block<4, U, 8> for U = 3 or 2, in assembly: GCC 12 kept the intrinsics' 24 sums in registers
  // but stored all of them to the stack every loop step (12 stp per 48 fmla, 75 instructions in
  // all); here 55 per two taps. The same sums in the same order as the intrinsics.
  template <int U>
  ETFUSE_ALWAYS_INLINE static void block8(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                          const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
    uint32_t lo_bits, hi_bits;
    std::memcpy(&lo_bits, &lo, 4);
    std::memcpy(&hi_bits, &hi, 4);
    const int64_t q4 = q * 4, acc_s4 = acc_s * 4;
    float* out = acc + q;
#define ETFUSE_DN_ASM(SEED, LD_X, TAP, CLAMP, STORE)                                             \
  asm volatile(                                                                                  \
      "mov x9, %[tap]\n mov x10, %[wl]\n mov x11, %[seed]\n" SEED "lsr x14, %[taps], #1\n"       \
      "cbz x14, 2f\n"                                                                            \
      "1:\n"                                                                                     \
      "ldp x12, x13, [x9], #16\n ld1 {v3.4s, v4.4s, v5.4s, v6.4s}, [x10], #64\n"                 \
      "add x12, x12, %[q4]\n add x13, x13, %[q4]\n" LD_X("x12") TAP(v3, v4) LD_X("x13") TAP(v5, v6) \
      "subs x14, x14, #1\n b.ne 1b\n"                                                            \
      "2:\n"                                                                                     \
      "tbz %[taps], #0, 3f\n"                                                                    \
      "ldr x12, [x9]\n ld1 {v3.4s, v4.4s}, [x10]\n add x12, x12, %[q4]\n" LD_X("x12") TAP(v3, v4)  \
      "3:\n"                                                                                     \
      "dup v0.4s, %w[lo]\n dup v1.4s, %w[hi]\n" CLAMP "mov x9, %[out]\n" STORE                   \
      :                                                                                          \
      : [tap] "r"(tap), [wl] "r"(wl), [seed] "r"(seed), [taps] "r"(taps), [q4] "r"(q4), [lo] "r"(lo_bits), \
        [hi] "r"(hi_bits), [out] "r"(out), [as] "r"(acc_s4)                                      \
      : "cc", "memory", "x9", "x10", "x11", "x12", "x13", "x14", "v0", "v1", "v2", "v3", "v4", "v5", "v6", \
        "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17", "v18", "v19", "v20", "v21", \
        "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31")
#define ETFUSE_DN_SEED3(a, b, c) "ld1r {" #a ".4s}, [x11], #4\n mov " #b ".16b, " #a ".16b\n mov " #c ".16b, " #a ".16b\n"
#define ETFUSE_DN_SEED2(a, b) "ld1r {" #a ".4s}, [x11], #4\n mov " #b ".16b, " #a ".16b\n"
#define ETFUSE_DN_LD3(x) "ld1 {v0.4s, v1.4s, v2.4s}, [" x "]\n"
#define ETFUSE_DN_LD2(x) "ld1 {v0.4s, v1.4s}, [" x "]\n"
#define ETFUSE_DN_CL(v) "fmax " #v ".4s, " #v ".4s, v0.4s\n fmin " #v ".4s, " #v ".4s, v1.4s\n"
#define ETFUSE_DN_CL8(a, b, c, d, e, f, g, h) \
  ETFUSE_DN_CL(a) ETFUSE_DN_CL(b) ETFUSE_DN_CL(c) ETFUSE_DN_CL(d) ETFUSE_DN_CL(e) ETFUSE_DN_CL(f) ETFUSE_DN_CL(g) ETFUSE_DN_CL(h)
#define ETFUSE_DN_ST3(a, c) "st1 {" #a ".4s - " #c ".4s}, [x9], %[as]\n"
#define ETFUSE_DN_ST2(a, b) "st1 {" #a ".4s, " #b ".4s}, [x9], %[as]\n"
    if constexpr (U == 3) {
      ETFUSE_DN_ASM(ETFUSE_DN_SEED3(v8, v9, v10) ETFUSE_DN_SEED3(v11, v12, v13) ETFUSE_DN_SEED3(v14, v15, v16)
                        ETFUSE_DN_SEED3(v17, v18, v19) ETFUSE_DN_SEED3(v20, v21, v22) ETFUSE_DN_SEED3(v23, v24, v25)
                            ETFUSE_DN_SEED3(v26, v27, v28) ETFUSE_DN_SEED3(v29, v30, v31),
                    ETFUSE_DN_LD3, ETFUSE_DN_TAP3,
                    ETFUSE_DN_CL8(v8, v9, v10, v11, v12, v13, v14, v15)
                        ETFUSE_DN_CL8(v16, v17, v18, v19, v20, v21, v22, v23)
                            ETFUSE_DN_CL8(v24, v25, v26, v27, v28, v29, v30, v31),
                    ETFUSE_DN_ST3(v8, v10) ETFUSE_DN_ST3(v11, v13) ETFUSE_DN_ST3(v14, v16) ETFUSE_DN_ST3(v17, v19)
                        ETFUSE_DN_ST3(v20, v22) ETFUSE_DN_ST3(v23, v25) ETFUSE_DN_ST3(v26, v28)
                            ETFUSE_DN_ST3(v29, v31));
    } else {
      static_assert(U == 2, "3 or 2 vectors");
      ETFUSE_DN_ASM(ETFUSE_DN_SEED2(v8, v9) ETFUSE_DN_SEED2(v10, v11) ETFUSE_DN_SEED2(v12, v13)
                        ETFUSE_DN_SEED2(v14, v15) ETFUSE_DN_SEED2(v16, v17) ETFUSE_DN_SEED2(v18, v19)
                            ETFUSE_DN_SEED2(v20, v21) ETFUSE_DN_SEED2(v22, v23),
                    ETFUSE_DN_LD2, ETFUSE_DN_TAP2,
                    ETFUSE_DN_CL8(v8, v9, v10, v11, v12, v13, v14, v15) ETFUSE_DN_CL8(v16, v17, v18, v19, v20, v21, v22, v23),
                    ETFUSE_DN_ST2(v8, v9) ETFUSE_DN_ST2(v10, v11) ETFUSE_DN_ST2(v12, v13) ETFUSE_DN_ST2(v14, v15)
                        ETFUSE_DN_ST2(v16, v17) ETFUSE_DN_ST2(v18, v19) ETFUSE_DN_ST2(v20, v21)
                            ETFUSE_DN_ST2(v22, v23));
    }
#undef ETFUSE_DN_ASM
#undef ETFUSE_DN_SEED3
#undef ETFUSE_DN_SEED2
#undef ETFUSE_DN_LD3
#undef ETFUSE_DN_LD2
#undef ETFUSE_DN_CL
#undef ETFUSE_DN_CL8
#undef ETFUSE_DN_ST3
#undef ETFUSE_DN_ST2
  }
  template <int W, int U, int P>
  ETFUSE_ALWAYS_INLINE static void block(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                         const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
    static_assert(W == 4 && P <= kPlanes, "NEON vectors, at most 8 planes");
    if constexpr (P == 8 && (U == 3 || U == 2)) {
      block8<U>(q, seed, taps, tap, wl, lo, hi, acc, acc_s);
    } else {
      block_intrinsics<U, P>(q, seed, taps, tap, wl, lo, hi, acc, acc_s);
    }
  }
  template <int U, int P>
  ETFUSE_ALWAYS_INLINE static void block_intrinsics(int64_t q, const float* seed, int64_t taps, const float* const* tap,
                                                    const float* wl, float lo, float hi, float* acc, int64_t acc_s) {
    float32x4_t r[P][U];
    for (int p = 0; p < P; ++p)
      for (int u = 0; u < U; ++u) r[p][u] = vdupq_n_f32(seed[p]);
    int64_t k = 0;
    for (; k + 2 <= taps; k += 2) {
      tap_step<U, P>(r, tap[k] + q, wl + k * kPlanes);
      tap_step<U, P>(r, tap[k + 1] + q, wl + (k + 1) * kPlanes);
    }
    if (k < taps) tap_step<U, P>(r, tap[k] + q, wl + k * kPlanes);
    const float32x4_t vlo = vdupq_n_f32(lo), vhi = vdupq_n_f32(hi);
    for (int p = 0; p < P; ++p) {
      for (int u = 0; u < U; ++u) r[p][u] = clamp4<2>(r[p][u], vlo, vhi);
      store_vectors<U>(acc + p * acc_s + q, r[p]);
    }
  }
};
#undef ETFUSE_DN_FMLA3
#undef ETFUSE_DN_TAP3
#undef ETFUSE_DN_FMLA2
#undef ETFUSE_DN_TAP2

// Depthwise convs 4 channels a vector (core/conv2d/depthwise_blocks.h, detail::depthwise_blocks_neon), as
// XNNPACK's NHWC kernels run them: a block's 4 input planes are interleaved into a zero-padded
// [PH][PW][4] buffer (one st4 per 4 pixels), every output pixel is one fmla per tap for the 4
// channels, 4 pixels of a row at a time (their taps' loads shared), and the [pixel][4] sums go
// back to the planes by ld4. The plane-by-plane rows kernel pays its setup per channel (a
// padded copy, a call per row pair, dropped columns on rows that are not whole vectors).
struct ChannelsNeon {
  // dst[j * 4 + c] = src[c][j] for j < n: groups of 4 pixels by st4, the last group ending at n
  // (overlapping: the same values written twice), under 4 pixels lane by lane
  ETFUSE_ALWAYS_INLINE static void interleave(const float* const (&src)[4], int64_t n, float* dst) {
    if (n >= 4) {
      for (int64_t j = 0;; j += 4) {
        if (j + 4 > n) j = n - 4;
        float32x4x4_t v;
        for (int c = 0; c < 4; ++c) v.val[c] = vld1q_f32(src[c] + j);
        vst4q_f32(dst + 4 * j, v);
        if (j + 4 >= n) break;
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      float32x4_t v = vdupq_n_f32(0.0f);
      v = vld1q_lane_f32(src[0] + j, v, 0);
      v = vld1q_lane_f32(src[1] + j, v, 1);
      v = vld1q_lane_f32(src[2] + j, v, 2);
      v = vld1q_lane_f32(src[3] + j, v, 3);
      vst1q_f32(dst + 4 * j, v);
    }
  }

  // dst[c][j] = src[j * 4 + c] for j < n: interleave's inverse
  ETFUSE_ALWAYS_INLINE static void deinterleave(const float* src, int64_t n, float* const (&dst)[4]) {
    if (n >= 4) {
      for (int64_t j = 0;; j += 4) {
        if (j + 4 > n) j = n - 4;
        const float32x4x4_t v = vld4q_f32(src + 4 * j);
        for (int c = 0; c < 4; ++c) vst1q_f32(dst[c] + j, v.val[c]);
        if (j + 4 >= n) break;
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float32x4_t v = vld1q_f32(src + 4 * j);
      vst1q_lane_f32(dst[0] + j, v, 0);
      vst1q_lane_f32(dst[1] + j, v, 1);
      vst1q_lane_f32(dst[2] + j, v, 2);
      vst1q_lane_f32(dst[3] + j, v, 3);
    }
  }

  // out[r * 4, + 4) for r < R = clamp(vb + sum_{kh, kw} w[kh * K + kw] * in[kh * in_s + (r * S + kw) * 4, + 4))
  template <int K, int S, int R, int kAct>
  ETFUSE_ALWAYS_INLINE static void pixels(const float* in, int64_t in_s, const float32x4_t* w, float32x4_t vb,
                                          float32x4_t vlo, float32x4_t vhi, float* out) {
    float32x4_t acc[R];
    for (int r = 0; r < R; ++r) acc[r] = vb;
    static_for<K>([&](auto khc) {
      constexpr int kh = decltype(khc)::value;
      const float* row = in + kh * in_s;
      static_for<(R - 1) * S + K>([&](auto ic) {  // input pixel i feeds output r at tap kw = i - r * S
        constexpr int i = decltype(ic)::value;
        const float32x4_t x = vld1q_f32(row + 4 * i);
        static_for<R>([&](auto rc) {
          constexpr int r = decltype(rc)::value, kw = i - r * S;
          if constexpr (kw >= 0 && kw < K) acc[r] = vfmaq_f32(acc[r], x, w[kh * K + kw]);
        });
      });
    });
    for (int r = 0; r < R; ++r) vst1q_f32(out + 4 * r, clamp4<kAct>(acc[r], vlo, vhi));
  }

  // sums[(oh * OW + ow) * 4, + 4) for the OH x OW outputs from the padded [.][PW][4] buffer; wt: K * K
  // vectors of the 4 channels' weights, seed: their biases
  template <int K, int S, int kAct>
  static void rows(const float* buf, int64_t PW, const float* wt, const float* seed, float lo, float hi, int64_t OH,
                   int64_t OW, float* sums) {
    float32x4_t w[K * K];
    for (int k = 0; k < K * K; ++k) w[k] = vld1q_f32(wt + 4 * k);
    const float32x4_t vb = vld1q_f32(seed), vlo = vdupq_n_f32(lo), vhi = vdupq_n_f32(hi);
    const int64_t in_s = PW * 4;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* in = buf + oh * S * in_s;
      float* o = sums + oh * OW * 4;
      int64_t ow = 0;
      for (; ow + 4 <= OW; ow += 4) pixels<K, S, 4, kAct>(in + ow * S * 4, in_s, w, vb, vlo, vhi, o + ow * 4);
      switch (OW - ow) {
        case 3: pixels<K, S, 3, kAct>(in + ow * S * 4, in_s, w, vb, vlo, vhi, o + ow * 4); break;
        case 2: pixels<K, S, 2, kAct>(in + ow * S * 4, in_s, w, vb, vlo, vhi, o + ow * 4); break;
        case 1: pixels<K, S, 1, kAct>(in + ow * S * 4, in_s, w, vb, vlo, vhi, o + ow * 4); break;
        default: break;
      }
    }
  }

  typedef void (*Rows)(const float*, int64_t, const float*, const float*, float, float, int64_t, int64_t, float*);
  static bool supports(int64_t K, int64_t S) { return (K == 3 || K == 5) && (S == 1 || S == 2); }
  static Rows pick(int64_t K, int64_t S, int act) {
    static constexpr Rows table[2][2][3] = {
        {{&rows<3, 1, 0>, &rows<3, 1, 1>, &rows<3, 1, 2>}, {&rows<3, 2, 0>, &rows<3, 2, 1>, &rows<3, 2, 2>}},
        {{&rows<5, 1, 0>, &rows<5, 1, 1>, &rows<5, 1, 2>}, {&rows<5, 2, 0>, &rows<5, 2, 1>, &rows<5, 2, 2>}}};
    return table[K == 5][S == 2][act];
  }
};

}  // namespace arm
}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
