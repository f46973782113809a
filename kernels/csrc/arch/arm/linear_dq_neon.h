// linear_dq's primitives on aarch64 (core/linear_dq.h includes this inside namespace linear_dq).
//   * neon: core/linear_dq_rows.h's primitives, the same results as core/linear_dq_portable.h's:
//     the row quantization's float32 steps lane for lane (frintn is round half to even, as
//     nearbyint), the int16 x int16 products summed into int32 by smlal / smlal2 (exact, as the
//     AVX2 pmaddwd path).
//   * dot (cores with ARMv8.2 sdot): the rows kept as int8 qx, the weight read as stored, its
//     integers (int8 q, or the int4 nibbles u = q + 8) dotted with qx by sdot, exact in int32:
//       D' = sum qx * w - (zp + o) * gsum,   gsum = sum qx,  o = 8 for nibbles, 0 for int8
//     and the zx term, zx * Args::row_sums[n], taken once per column (core/linear_dq.h's store_q8).
//     int4 one row at a time against 4 columns, 4 groups reduced together (row_int4); int8 two
//     rows at a time.
//   The float steps after D' (scales, zx term, bias, residual) are the portable code's in another order
//   (4 groups' partial sums): float tolerance, not bit for bit.
// No includes here: arm_neon.h and <vector> come at file scope from core/linear_dq.h, which also
// defines ETFUSE_DQ_NEON_DOT (the dot kernels' target).
namespace neon {

ETFUSE_ALWAYS_INLINE void min_max(const float* v, int64_t n, float& mn, float& mx) {
  int64_t i = 0;
  mn = mx = v[0];
  if (n >= 8) {
    float32x4_t lo0 = vld1q_f32(v), hi0 = lo0, lo1 = vld1q_f32(v + 4), hi1 = lo1;
    for (i = 8; i + 8 <= n; i += 8) {
      const float32x4_t a = vld1q_f32(v + i), b = vld1q_f32(v + i + 4);
      lo0 = vminq_f32(lo0, a), hi0 = vmaxq_f32(hi0, a);
      lo1 = vminq_f32(lo1, b), hi1 = vmaxq_f32(hi1, b);
    }
    const float l = vminvq_f32(vminq_f32(lo0, lo1)), h = vmaxvq_f32(vmaxq_f32(hi0, hi1));
    mn = l < mn ? l : mn;
    mx = h > mx ? h : mx;
  }
  for (; i < n; ++i) {
    mn = v[i] < mn ? v[i] : mn;
    mx = v[i] > mx ? v[i] : mx;
  }
}

// 4 values: clamp(rint(v * inv) + zp, -128, 127) as int32 (integral: the conversion is exact).
ETFUSE_ALWAYS_INLINE int32x4_t quantize4(const float* v, float32x4_t inv, float32x4_t zp) {
  float32x4_t q = vaddq_f32(vrndnq_f32(vmulq_f32(vld1q_f32(v), inv)), zp);
  q = vminq_f32(vmaxq_f32(q, vdupq_n_f32(kQmin)), vdupq_n_f32(kQmax));
  return vcvtq_s32_f32(q);
}

// x = qx - zx as int16 (quantized()'s steps; zp integral, so subtracting it in int32 is exact).
ETFUSE_ALWAYS_INLINE void quantize(const float* v, int64_t n, float inv, float zp, int16_t* out) {
  const float32x4_t vinv = vdupq_n_f32(inv), vzp = vdupq_n_f32(zp);
  const int32x4_t izp = vdupq_n_s32(static_cast<int32_t>(zp));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int32x4_t a = vsubq_s32(quantize4(v + i, vinv, vzp), izp);
    const int32x4_t b = vsubq_s32(quantize4(v + i + 4, vinv, vzp), izp);
    vst1q_s16(out + i, vcombine_s16(vmovn_s32(a), vmovn_s32(b)));
  }
  for (; i < n; ++i) out[i] = quantized(v[i], inv, zp);
}

// Weight row n's integers q as int16 (zero points not subtracted).
ETFUSE_ALWAYS_INLINE void widen(const Args& a, int64_t n, int16_t* out) {
  const uint8_t* w = a.W + n * a.w_rs;
  if (a.bits == 8) {
    int64_t k = 0;
    for (; k + 16 <= a.K; k += 16) {
      const int8x16_t b = vld1q_s8(reinterpret_cast<const int8_t*>(w + k));
      vst1q_s16(out + k, vmovl_s8(vget_low_s8(b)));
      vst1q_s16(out + k + 8, vmovl_high_s8(b));
    }
    for (; k < a.K; ++k) out[k] = static_cast<int8_t>(w[k]);
    return;
  }
  const uint8x16_t mask = vdupq_n_u8(15);
  const int8x16_t eight = vdupq_n_s8(8);
  for (int64_t c = 0; c < a.K; c += kChunk) {
    const uint8x16_t b = vld1q_u8(w + c / 2);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, mask)), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
    vst1q_s16(out + c, vmovl_s8(vget_low_s8(lo)));
    vst1q_s16(out + c + 8, vmovl_high_s8(lo));
    vst1q_s16(out + c + 16, vmovl_s8(vget_low_s8(hi)));
    vst1q_s16(out + c + 24, vmovl_high_s8(hi));
  }
}

// The four columns' sums of int32 lanes, as one vector [c0 c1 c2 c3].
ETFUSE_ALWAYS_INLINE int32x4_t column_sums(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
  return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

// portable::dot_groups_of on NEON: groups of kG columns (0: G, known at run time only); each weight
// vector loaded once for the R rows.
template <int R, int64_t kG>
ETFUSE_ALWAYS_INLINE void dot_groups_of(const int16_t* const* x, const int32_t* const* gsum, const int16_t* const* w,
                                        int64_t G_, int64_t groups, const float* st, const int32_t* zt,
                                        float (*out)[kCols]) {
  static_assert(kCols == 4, "column_sums sums 4 columns");
  const int64_t G = kG ? kG : G_;
  const int64_t whole = G / 8 * 8;
  float32x4_t tot[R];
  for (int r = 0; r < R; ++r) tot[r] = vdupq_n_f32(0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G;
    int32x4_t acc[R][kCols];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c] = vdupq_n_s32(0);
    for (int64_t k = k0; k < k0 + whole; k += 8) {
      int16x8_t wv[kCols];
      for (int c = 0; c < kCols; ++c) wv[c] = vld1q_s16(w[c] + k);
      for (int r = 0; r < R; ++r) {
        const int16x8_t xv = vld1q_s16(x[r] + k);
        for (int c = 0; c < kCols; ++c) {
          acc[r][c] = vmlal_s16(acc[r][c], vget_low_s16(xv), vget_low_s16(wv[c]));
          acc[r][c] = vmlal_high_s16(acc[r][c], xv, wv[c]);
        }
      }
    }
    const float32x4_t sv = vld1q_f32(st + g * kCols);
    for (int r = 0; r < R; ++r) {
      int32x4_t d = column_sums(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      if (whole < G) {  // int8 weights whose group is not a multiple of 8 columns
        int32_t rest[kCols] = {0, 0, 0, 0};
        for (int c = 0; c < kCols; ++c)
          for (int64_t k = k0 + whole; k < k0 + G; ++k) rest[c] += static_cast<int32_t>(x[r][k]) * w[c][k];
        d = vaddq_s32(d, vld1q_s32(rest));
      }
      if (zt) d = vmlsq_n_s32(d, vld1q_s32(zt + g * kCols), gsum[r][g]);
      tot[r] = vfmaq_f32(tot[r], vcvtq_f32_s32(d), sv);
    }
  }
  for (int r = 0; r < R; ++r) vst1q_f32(out[r], tot[r]);
}

// ---- dot: sdot on int8 rows ---------------------------------------------------------------------

// One row: qx = clamp(rint(v * inv) + zp, -128, 127) (int8, in column order) and gsum, its sums
// over each group of G columns (core/linear_dq_rows.h's quantize_rows_q8 calls it).
ETFUSE_ALWAYS_INLINE void quantize_q8(const float* v, int64_t K, int64_t G, float inv, float zp, int8_t* q,
                                      int32_t* gsum) {
  const float32x4_t vinv = vdupq_n_f32(inv), vzp = vdupq_n_f32(zp);
  int64_t i = 0;
  for (; i + 16 <= K; i += 16) {
    const int16x8_t l = vcombine_s16(vmovn_s32(quantize4(v + i, vinv, vzp)),
                                     vmovn_s32(quantize4(v + i + 4, vinv, vzp)));
    const int16x8_t h = vcombine_s16(vmovn_s32(quantize4(v + i + 8, vinv, vzp)),
                                     vmovn_s32(quantize4(v + i + 12, vinv, vzp)));
    vst1q_s8(q + i, vcombine_s8(vmovn_s16(l), vmovn_s16(h)));
  }
  const int16_t z = static_cast<int16_t>(zp);
  for (; i < K; ++i) q[i] = static_cast<int8_t>(quantized(v[i], inv, zp) + z);
  for (int64_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const int8_t* s = q + k0;
    int32_t sum = 0;
    int64_t k = 0;
    for (; k + 16 <= G; k += 16) sum += vaddlvq_s16(vpaddlq_s8(vld1q_s8(s + k)));
    for (; k < G; ++k) sum += s[k];
    gsum[g] = sum;
  }
}

// The 4 int8 zero points at p as int32.
ETFUSE_ALWAYS_INLINE int32x4_t zero_points4(const int8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(v)))));
}

// One row (qx and its gsum) against NC int4 weight rows (w, w_rs apart): out[c] = sum_g scale * D'.
// Four groups at a time: per column the 4 groups' sdot sums reduce (addp) to one vector
// [g0 g1 g2 g3], so the scales and zero points are read as stored ([N, groups], rows `groups`
// apart; zp null: none), 4 groups a load; the last groups % 4 one at a time. With the nibbles
// u = q + 8: D' = sum qx * u - (zp + 8) * gsum.
template <int NC, int64_t kG>
ETFUSE_DQ_NEON_DOT ETFUSE_ALWAYS_INLINE void row_int4(const int8_t* x, const int32_t* gsum, int64_t G_, int64_t groups,
                                                      const uint8_t* w, int64_t w_rs, const float* sc,
                                                      const int8_t* zp, float* out) {
  const int64_t G = kG ? kG : G_;
  const uint8x16_t mask = vdupq_n_u8(15);
  float32x4_t tot[NC];
  for (int c = 0; c < NC; ++c) tot[c] = vdupq_n_f32(0.0f);
  int64_t g = 0;
  for (; g + 4 <= groups; g += 4) {
    int32x4_t acc[NC][4];
    for (int t = 0; t < 4; ++t) {
      for (int c = 0; c < NC; ++c) acc[c][t] = vdupq_n_s32(0);
      for (int64_t k = (g + t) * G; k < (g + t + 1) * G; k += kChunk) {
        const int8x16_t xl = vld1q_s8(x + k), xh = vld1q_s8(x + k + 16);
        for (int c = 0; c < NC; ++c) {
          const uint8x16_t b = vld1q_u8(w + c * w_rs + k / 2);
          acc[c][t] = vdotq_s32(acc[c][t], xl, vreinterpretq_s8_u8(vandq_u8(b, mask)));
          acc[c][t] = vdotq_s32(acc[c][t], xh, vreinterpretq_s8_u8(vshrq_n_u8(b, 4)));
        }
      }
    }
    const int32x4_t gs = vld1q_s32(gsum + g), off = vshlq_n_s32(gs, 3);
    for (int c = 0; c < NC; ++c) {
      int32x4_t d = vpaddq_s32(vpaddq_s32(acc[c][0], acc[c][1]), vpaddq_s32(acc[c][2], acc[c][3]));
      d = vsubq_s32(d, off);
      if (zp) d = vmlsq_s32(d, zero_points4(zp + c * groups + g), gs);
      tot[c] = vfmaq_f32(tot[c], vcvtq_f32_s32(d), vld1q_f32(sc + c * groups + g));
    }
  }
  float rest[NC] = {};
  for (; g < groups; ++g) {
    int32x4_t acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = vdupq_n_s32(0);
    for (int64_t k = g * G; k < (g + 1) * G; k += kChunk) {
      const int8x16_t xl = vld1q_s8(x + k), xh = vld1q_s8(x + k + 16);
      for (int c = 0; c < NC; ++c) {
        const uint8x16_t b = vld1q_u8(w + c * w_rs + k / 2);
        acc[c] = vdotq_s32(acc[c], xl, vreinterpretq_s8_u8(vandq_u8(b, mask)));
        acc[c] = vdotq_s32(acc[c], xh, vreinterpretq_s8_u8(vshrq_n_u8(b, 4)));
      }
    }
    for (int c = 0; c < NC; ++c) {
      const int32_t z = (zp ? zp[c * groups + g] : 0) + 8;
      rest[c] += sc[c * groups + g] * static_cast<float>(vaddvq_s32(acc[c]) - z * gsum[g]);
    }
  }
  if (NC == 4) {
    const float32x4_t t = vpaddq_f32(vpaddq_f32(tot[0], tot[1]), vpaddq_f32(tot[2], tot[3]));
    vst1q_f32(out, vaddq_f32(t, vld1q_f32(rest)));
  } else {
    for (int c = 0; c < NC; ++c) out[c] = vaddvq_f32(tot[c]) + rest[c];
  }
}

template <int NC>
ETFUSE_DQ_NEON_DOT ETFUSE_ALWAYS_INLINE void row_int4_of(const int8_t* x, const int32_t* gsum, int64_t G,
                                                         int64_t groups, const uint8_t* w, int64_t w_rs,
                                                         const float* sc, const int8_t* zp, float* out) {
  switch (G) {
    case 32: return row_int4<NC, 32>(x, gsum, G, groups, w, w_rs, sc, zp, out);
    case 64: return row_int4<NC, 64>(x, gsum, G, groups, w, w_rs, sc, zp, out);
    case 128: return row_int4<NC, 128>(x, gsum, G, groups, w, w_rs, sc, zp, out);
    default: return row_int4<NC, 0>(x, gsum, G, groups, w, w_rs, sc, zp, out);
  }
}

// Columns [j, j + NC) of C for every row, int4.
template <int NC>
ETFUSE_DQ_NEON_DOT ETFUSE_ALWAYS_INLINE void block_int4(const Args& a, const Rows& r, int64_t j) {
  const uint8_t* w = a.W + j * a.w_rs;
  const float* sc = a.scales + j * a.groups;
  const int8_t* zp = a.zp ? a.zp + j * a.groups : nullptr;
  const int64_t G = a.K / a.groups;
  for (int64_t m = 0; m < a.M; ++m) {
    float sums[NC];
    row_int4_of<NC>(r.qx + m * a.K, r.gsum + m * a.groups, G, a.groups, w, a.w_rs, sc, zp, sums);
    for (int c = 0; c < NC; ++c) store_q8(a, r, m, j + c, sums[c]);
  }
}

// Rows [m, m + R) of C, columns [j, j + nj) (nj <= 4; w[c] past nj repeats a valid row), int8
// weights: out[r][c] = sum_g scale * D'. st, zo: [groups][4] scales and zero points.
template <int R>
ETFUSE_DQ_NEON_DOT ETFUSE_ALWAYS_INLINE void rows_int8(const Args& a, const Rows& rows, int64_t m,
                                                       const uint8_t* const* w, const float* st, const int32_t* zo,
                                                       float (*out)[kCols]) {
  const int64_t G = a.K / a.groups;
  const int64_t whole = G / 16 * 16;
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = rows.qx + (m + r) * a.K;
  float32x4_t tot[R];
  for (int r = 0; r < R; ++r) tot[r] = vdupq_n_f32(0.0f);
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t k0 = g * G;
    int32x4_t acc[R][kCols];
    for (int c = 0; c < kCols; ++c)
      for (int r = 0; r < R; ++r) acc[r][c] = vdupq_n_s32(0);
    for (int64_t k = k0; k < k0 + whole; k += 16) {
      int8x16_t xv[R];
      for (int r = 0; r < R; ++r) xv[r] = vld1q_s8(x[r] + k);
      for (int c = 0; c < kCols; ++c) {
        const int8x16_t b = vld1q_s8(reinterpret_cast<const int8_t*>(w[c] + k));
        for (int r = 0; r < R; ++r) acc[r][c] = vdotq_s32(acc[r][c], xv[r], b);
      }
    }
    int32_t rest[R][kCols] = {};
    for (int c = 0; c < kCols; ++c) {  // groups that are not a multiple of 16 columns
      const int8_t* wc = reinterpret_cast<const int8_t*>(w[c]);
      for (int64_t k = k0 + whole; k < k0 + G; ++k)
        for (int r = 0; r < R; ++r) rest[r][c] += x[r][k] * wc[k];
    }
    const int32x4_t z = vld1q_s32(zo + g * kCols);
    const float32x4_t sv = vld1q_f32(st + g * kCols);
    for (int r = 0; r < R; ++r) {
      int32x4_t d = vaddq_s32(column_sums(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), vld1q_s32(rest[r]));
      d = vmlsq_n_s32(d, z, rows.gsum[(m + r) * a.groups + g]);
      tot[r] = vfmaq_f32(tot[r], vcvtq_f32_s32(d), sv);
    }
  }
  for (int r = 0; r < R; ++r) vst1q_f32(out[r], tot[r]);
}

// Columns [j0, j1) of C for every row, kCols weight rows at a time. int4: block_int4 (the last
// columns one at a time). int8: the scales and zero points transposed to [groups][kCols] once,
// two rows at a time.
template <int Bits>
ETFUSE_DQ_NEON_DOT void cols_dot(const Args& a, const Rows& rows, int64_t j0, int64_t j1) {
  std::vector<float> st(Bits == 8 ? static_cast<size_t>(a.groups * kCols) : 0);
  std::vector<int32_t> zo(st.size());
  for (int64_t j = j0; j < j1; j += kCols) {
    const int64_t nj = (j1 - j) < kCols ? (j1 - j) : kCols;
    if (Bits == 4) {
      if (nj == kCols) {
        block_int4<kCols>(a, rows, j);
      } else {
        for (int64_t c = 0; c < nj; ++c) block_int4<1>(a, rows, j + c);
      }
      continue;
    }
    const uint8_t* w[kCols];
    for (int c = 0; c < kCols; ++c) {
      const int64_t n = j + (c < nj ? c : 0);  // past the last column: the first again, not stored
      w[c] = a.W + n * a.w_rs;
      for (int64_t g = 0; g < a.groups; ++g) {
        st[g * kCols + c] = a.scales[n * a.groups + g];
        zo[g * kCols + c] = a.zp ? a.zp[n * a.groups + g] : 0;
      }
    }
    float sums[2][kCols];
    int64_t m = 0;
    for (; m + 2 <= a.M; m += 2) {
      rows_int8<2>(a, rows, m, w, st.data(), zo.data(), sums);
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < nj; ++c) store_q8(a, rows, m + r, j + c, sums[r][c]);
    }
    if (m < a.M) {
      rows_int8<1>(a, rows, m, w, st.data(), zo.data(), sums);
      for (int c = 0; c < nj; ++c) store_q8(a, rows, m, j + c, sums[0][c]);
    }
  }
}

}  // namespace neon
