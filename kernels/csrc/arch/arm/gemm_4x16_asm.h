// The f32 GEMM's 4 x 16 NEON tile in aarch64 assembly: the K loop of gemm_neon.h's two A layouts,
// with B's four vectors adjacent (a packed panel, or a row of B read in place) and its k rows
// any number of bytes apart. Written in assembly as XNNPACK's f32-gemm neonfma kernels are: GCC's
// register allocation of the same intrinsics (one ld1 of four registers per k row) added a move
// per 4 fmla. Per four k steps: A's loads, 4 ld1 of B (post-incremented by B's row stride), 64
// fmla by lane and the loop's 2: 74 instructions (GCC's best from intrinsics 82, at run-time
// strides 85).
//
// The sums are outputs only, zeroed here: an in-out operand counts twice against asm's 30.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "core/common.h"

// acc[r][q] += B vector q * A lane `lane` of v{16 + r} (rows kernel: A row r's four k values) or
// of v16 (adjacent kernel: k's four rows, A_REG "v16", lane = the row).
#define ETFUSE_FMLA_ROW(r, areg, lane, b0, b1, b2, b3)                                               \
  "fmla %[c" #r "0].4s, " #b0 ".4s, " areg ".s[" #lane "]\n fmla %[c" #r "1].4s, " #b1 ".4s, " areg \
  ".s[" #lane "]\n fmla %[c" #r "2].4s, " #b2 ".4s, " areg ".s[" #lane "]\n fmla %[c" #r "3].4s, " #b3 \
  ".4s, " areg ".s[" #lane "]\n"

#define ETFUSE_ZERO_SUMS                                                                      \
  "movi %[c00].16b, #0\n movi %[c01].16b, #0\n movi %[c02].16b, #0\n movi %[c03].16b, #0\n" \
  "movi %[c10].16b, #0\n movi %[c11].16b, #0\n movi %[c12].16b, #0\n movi %[c13].16b, #0\n" \
  "movi %[c20].16b, #0\n movi %[c21].16b, #0\n movi %[c22].16b, #0\n movi %[c23].16b, #0\n" \
  "movi %[c30].16b, #0\n movi %[c31].16b, #0\n movi %[c32].16b, #0\n movi %[c33].16b, #0\n"

#define ETFUSE_SUM_OUTPUTS(acc)                                                                           \
  [c00] "=w"(acc[0][0]), [c01] "=w"(acc[0][1]), [c02] "=w"(acc[0][2]), [c03] "=w"(acc[0][3]),            \
      [c10] "=w"(acc[1][0]), [c11] "=w"(acc[1][1]), [c12] "=w"(acc[1][2]), [c13] "=w"(acc[1][3]),        \
      [c20] "=w"(acc[2][0]), [c21] "=w"(acc[2][1]), [c22] "=w"(acc[2][2]), [c23] "=w"(acc[2][3]),        \
      [c30] "=w"(acc[3][0]), [c31] "=w"(acc[3][1]), [c32] "=w"(acc[3][2]), [c33] "=w"(acc[3][3])

#define ETFUSE_B_LOW "ld1 {v20.4s, v21.4s, v22.4s, v23.4s}, [%[b]], %[bs]\n"
#define ETFUSE_B_HIGH "ld1 {v24.4s, v25.4s, v26.4s, v27.4s}, [%[b]], %[bs]\n"

namespace etfuse {
namespace core {
namespace gemm {
namespace arm {

// Rows of A contiguous along k: acc[r][q] = sum over 4 * n4 k steps of ap[r][k] * B(k, 4q..4q+3),
// B's k rows b_stride bytes apart. Advances ap[] and b past what was read.
ETFUSE_ALWAYS_INLINE void rows_4x16(float32x4_t (&acc)[4][4], const float* (&ap)[4], const float*& b,
                                    int64_t b_stride, int64_t n4) {
#define ETFUSE_FMLA_K(lane, b0, b1, b2, b3)                                                     \
  ETFUSE_FMLA_ROW(0, "v16", lane, b0, b1, b2, b3) ETFUSE_FMLA_ROW(1, "v17", lane, b0, b1, b2, b3) \
  ETFUSE_FMLA_ROW(2, "v18", lane, b0, b1, b2, b3) ETFUSE_FMLA_ROW(3, "v19", lane, b0, b1, b2, b3)
  asm volatile(
      ETFUSE_ZERO_SUMS
      "cbz %[n], 2f\n"
      "1:\n"
      "ldr q16, [%[a0]], #16\n ldr q17, [%[a1]], #16\n ldr q18, [%[a2]], #16\n ldr q19, [%[a3]], #16\n"
      ETFUSE_B_LOW ETFUSE_B_HIGH
      ETFUSE_FMLA_K(0, v20, v21, v22, v23)
      ETFUSE_B_LOW
      ETFUSE_FMLA_K(1, v24, v25, v26, v27)
      ETFUSE_B_HIGH
      ETFUSE_FMLA_K(2, v20, v21, v22, v23)
      ETFUSE_FMLA_K(3, v24, v25, v26, v27)
      "subs %[n], %[n], #1\n b.ne 1b\n"
      "2:\n"
      : ETFUSE_SUM_OUTPUTS(acc),
        [a0] "+r"(ap[0]), [a1] "+r"(ap[1]), [a2] "+r"(ap[2]), [a3] "+r"(ap[3]), [b] "+r"(b), [n] "+r"(n4)
      : [bs] "r"(b_stride)
      : "cc", "memory", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27");
#undef ETFUSE_FMLA_K
}

// Rows of A one float apart (A(i, k) = a[i + k * a_stride / 4]): acc[r][q] = sum over 4 * n4 k steps
// of A(r, k) * B(k, 4q..4q+3). Advances a and b past what was read.
ETFUSE_ALWAYS_INLINE void adjacent_4x16(float32x4_t (&acc)[4][4], const float*& a, int64_t a_stride, const float*& b,
                                        int64_t b_stride, int64_t n4) {
#define ETFUSE_FMLA_K(areg, b0, b1, b2, b3)                                                   \
  ETFUSE_FMLA_ROW(0, areg, 0, b0, b1, b2, b3) ETFUSE_FMLA_ROW(1, areg, 1, b0, b1, b2, b3) \
  ETFUSE_FMLA_ROW(2, areg, 2, b0, b1, b2, b3) ETFUSE_FMLA_ROW(3, areg, 3, b0, b1, b2, b3)
  asm volatile(
      ETFUSE_ZERO_SUMS
      "cbz %[n], 2f\n"
      "1:\n"
      "ld1 {v16.4s}, [%[a]], %[as]\n ld1 {v17.4s}, [%[a]], %[as]\n"
      "ld1 {v18.4s}, [%[a]], %[as]\n ld1 {v19.4s}, [%[a]], %[as]\n"
      ETFUSE_B_LOW ETFUSE_B_HIGH
      ETFUSE_FMLA_K("v16", v20, v21, v22, v23)
      ETFUSE_B_LOW
      ETFUSE_FMLA_K("v17", v24, v25, v26, v27)
      ETFUSE_B_HIGH
      ETFUSE_FMLA_K("v18", v20, v21, v22, v23)
      ETFUSE_FMLA_K("v19", v24, v25, v26, v27)
      "subs %[n], %[n], #1\n b.ne 1b\n"
      "2:\n"
      : ETFUSE_SUM_OUTPUTS(acc), [a] "+r"(a), [b] "+r"(b), [n] "+r"(n4)
      : [as] "r"(a_stride), [bs] "r"(b_stride)
      : "cc", "memory", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27");
#undef ETFUSE_FMLA_K
}

// A packed per tile as [k][4 rows] (gemm_neon.h's tiles_packed_a): acc[r][q] = sum over 4 * n4 k
// steps of a[4k + r] * B(k, 4q..4q+3). Four k steps of the tile's A are 64 contiguous bytes, one
// ld1 of four registers where the rows kernel loads one register per row, and the loop runs eight
// k steps an iteration: 70 instructions per 64 fmla instead of 74. Advances a and b past what was
// read.
ETFUSE_ALWAYS_INLINE void packed_4x16(float32x4_t (&acc)[4][4], const float*& a, const float*& b, int64_t b_stride,
                                      int64_t n4) {
#define ETFUSE_FMLA_K(areg, b0, b1, b2, b3)                                                   \
  ETFUSE_FMLA_ROW(0, areg, 0, b0, b1, b2, b3) ETFUSE_FMLA_ROW(1, areg, 1, b0, b1, b2, b3) \
  ETFUSE_FMLA_ROW(2, areg, 2, b0, b1, b2, b3) ETFUSE_FMLA_ROW(3, areg, 3, b0, b1, b2, b3)
#define ETFUSE_PACKED_4K                                                                             \
  "ld1 {v16.4s, v17.4s, v18.4s, v19.4s}, [%[a]], #64\n" ETFUSE_B_LOW ETFUSE_B_HIGH                  \
  ETFUSE_FMLA_K("v16", v20, v21, v22, v23) ETFUSE_B_LOW ETFUSE_FMLA_K("v17", v24, v25, v26, v27)     \
  ETFUSE_B_HIGH ETFUSE_FMLA_K("v18", v20, v21, v22, v23) ETFUSE_FMLA_K("v19", v24, v25, v26, v27)
  int64_t n8;
  asm volatile(
      ETFUSE_ZERO_SUMS
      "lsr %[n8], %[n], #1\n"
      "cbz %[n8], 2f\n"
      "1:\n"
      ETFUSE_PACKED_4K ETFUSE_PACKED_4K
      "subs %[n8], %[n8], #1\n b.ne 1b\n"
      "2:\n"
      "tbz %[n], #0, 3f\n"
      ETFUSE_PACKED_4K
      "3:\n"
      : ETFUSE_SUM_OUTPUTS(acc), [a] "+r"(a), [b] "+r"(b), [n8] "=&r"(n8)
      : [bs] "r"(b_stride), [n] "r"(n4)
      : "cc", "memory", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27");
#undef ETFUSE_PACKED_4K
#undef ETFUSE_FMLA_K
}

// packed_4x16 for a tile of 3 rows, A packed [k][3]: four k steps are 12 floats, 3 registers,
// row r of k step kk in lane (3 kk + r) % 4 of v{16 + (3 kk + r) / 4} (54 instructions per 48
// fmla, eight k steps an iteration; the rows kernel's intrinsics at 3 rows took about 66).
ETFUSE_ALWAYS_INLINE void packed_3x16(float32x4_t (&acc)[3][4], const float*& a, const float*& b, int64_t b_stride,
                                      int64_t n4) {
#define ETFUSE_PACKED_3K                                                                                    \
  "ld1 {v16.4s, v17.4s, v18.4s}, [%[a]], #48\n" ETFUSE_B_LOW ETFUSE_B_HIGH                                 \
  ETFUSE_FMLA_ROW(0, "v16", 0, v20, v21, v22, v23) ETFUSE_FMLA_ROW(1, "v16", 1, v20, v21, v22, v23)         \
  ETFUSE_FMLA_ROW(2, "v16", 2, v20, v21, v22, v23) ETFUSE_B_LOW                                             \
  ETFUSE_FMLA_ROW(0, "v16", 3, v24, v25, v26, v27) ETFUSE_FMLA_ROW(1, "v17", 0, v24, v25, v26, v27)         \
  ETFUSE_FMLA_ROW(2, "v17", 1, v24, v25, v26, v27) ETFUSE_B_HIGH                                            \
  ETFUSE_FMLA_ROW(0, "v17", 2, v20, v21, v22, v23) ETFUSE_FMLA_ROW(1, "v17", 3, v20, v21, v22, v23)         \
  ETFUSE_FMLA_ROW(2, "v18", 0, v20, v21, v22, v23) ETFUSE_FMLA_ROW(0, "v18", 1, v24, v25, v26, v27)         \
  ETFUSE_FMLA_ROW(1, "v18", 2, v24, v25, v26, v27) ETFUSE_FMLA_ROW(2, "v18", 3, v24, v25, v26, v27)
  int64_t n8;
  asm volatile(
      "movi %[c00].16b, #0\n movi %[c01].16b, #0\n movi %[c02].16b, #0\n movi %[c03].16b, #0\n"
      "movi %[c10].16b, #0\n movi %[c11].16b, #0\n movi %[c12].16b, #0\n movi %[c13].16b, #0\n"
      "movi %[c20].16b, #0\n movi %[c21].16b, #0\n movi %[c22].16b, #0\n movi %[c23].16b, #0\n"
      "lsr %[n8], %[n], #1\n"
      "cbz %[n8], 2f\n"
      "1:\n"
      ETFUSE_PACKED_3K ETFUSE_PACKED_3K
      "subs %[n8], %[n8], #1\n b.ne 1b\n"
      "2:\n"
      "tbz %[n], #0, 3f\n"
      ETFUSE_PACKED_3K
      "3:\n"
      : [c00] "=w"(acc[0][0]), [c01] "=w"(acc[0][1]), [c02] "=w"(acc[0][2]), [c03] "=w"(acc[0][3]),
        [c10] "=w"(acc[1][0]), [c11] "=w"(acc[1][1]), [c12] "=w"(acc[1][2]), [c13] "=w"(acc[1][3]),
        [c20] "=w"(acc[2][0]), [c21] "=w"(acc[2][1]), [c22] "=w"(acc[2][2]), [c23] "=w"(acc[2][3]),
        [a] "+r"(a), [b] "+r"(b), [n8] "=&r"(n8)
      : [bs] "r"(b_stride), [n] "r"(n4)
      : "cc", "memory", "v16", "v17", "v18", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27");
#undef ETFUSE_PACKED_3K
}

}  // namespace arm
}  // namespace gemm
}  // namespace core
}  // namespace etfuse

#undef ETFUSE_B_HIGH
#undef ETFUSE_B_LOW
#undef ETFUSE_SUM_OUTPUTS
#undef ETFUSE_ZERO_SUMS
#undef ETFUSE_FMLA_ROW
