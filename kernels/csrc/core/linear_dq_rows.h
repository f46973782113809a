// linear_dq's row quantization and column blocks (core/linear_dq.h) over one ISA's primitives:
// included once per ISA with ETFUSE_DQ_NS (its namespace) and ETFUSE_DQ_PRIMITIVES (the
// primitives' namespace: min_max, quantize, widen, dot_groups_of; with ETFUSE_DQ_Q8 defined also
// quantize_q8, the rows kept as int8 qx, and with ETFUSE_DQ_Q4 dot_q4, the int4 path on them).
// No include guard, on purpose; it undefines the four macros at its end.
namespace ETFUSE_DQ_NS {

namespace prim = ETFUSE_DQ_PRIMITIVES;

// torchao's qparams of one row of A, from its min and max.
ETFUSE_ALWAYS_INLINE RowQparams qparams_of(const float* row, int64_t K) {
  float mn, mx;
  prim::min_max(row, K, mn, mx);
  return row_qparams(mn, mx);
}

// Rows [m0, m1) of A -> x, their scales and (gsum non-null) their sums over each group.
inline void quantize_rows(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum) {
  const int64_t G = a.K / a.groups;
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = a.A + m * a.a_rs;
    const RowQparams p = qparams_of(row, a.K);
    int16_t* xm = x + m * a.K;
    prim::quantize(row, a.K, p.inv, p.zp, xm);
    scale[m] = p.scale;
    if (!gsum) continue;
    for (int64_t g = 0; g < a.groups; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * G; k < (g + 1) * G; ++k) sum += xm[k];
      gsum[m * a.groups + g] = sum;
    }
  }
}

// prim::dot_groups_of with torchao's usual groups (32, 64, 128) as the constant kG, so that the
// loops over a group unroll; 0 (G known at run time only) for the others.
template <int R>
ETFUSE_ALWAYS_INLINE void dot_groups(const int16_t* const* x, const int32_t* const* gsum, const int16_t* const* w,
                                     int64_t G, int64_t groups, const float* st, const int32_t* zt,
                                     float (*out)[kCols]) {
  switch (G) {
    case 32: return prim::dot_groups_of<R, 32>(x, gsum, w, G, groups, st, zt, out);
    case 64: return prim::dot_groups_of<R, 64>(x, gsum, w, G, groups, st, zt, out);
    case 128: return prim::dot_groups_of<R, 128>(x, gsum, w, G, groups, st, zt, out);
    default: return prim::dot_groups_of<R, 0>(x, gsum, w, G, groups, st, zt, out);
  }
}

// Rows [m, m + R) of C, columns [j, j + nj).
template <int R>
ETFUSE_ALWAYS_INLINE void rows_block(const Args& a, const Rows& r, int64_t m, int64_t j, int64_t nj,
                                     const int16_t* const* w, const float* st, const int32_t* zt) {
  const int16_t* x[R];
  const int32_t* gsum[R];
  for (int i = 0; i < R; ++i) {
    x[i] = r.x + (m + i) * a.K;
    gsum[i] = zt ? r.gsum + (m + i) * a.groups : nullptr;
  }
  float sums[R][kCols];
  dot_groups<R>(x, gsum, w, a.K / a.groups, a.groups, st, zt, sums);
  for (int i = 0; i < R; ++i) {
    for (int c = 0; c < nj; ++c) {
      const int64_t n = j + c;
      float y = sums[i][c] * r.scale[m + i];
      if (a.bias) y += a.bias[n];
      if (a.residual) y += a.residual[(m + i) * a.r_rs + n];
      a.C[(m + i) * a.c_rs + n] = y;
    }
  }
}

// Columns [j0, j1) of C for every row: per block of kCols weight rows, the rows widened to int16
// and their scales and zero points transposed ([groups][kCols]) once, then two rows of A at a time.
inline void cols(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  std::vector<int16_t> widened(static_cast<size_t>(kCols * a.K));
  std::vector<float> st(static_cast<size_t>(a.groups * kCols));
  std::vector<int32_t> zt(a.zp ? static_cast<size_t>(a.groups * kCols) : 0);
  for (int64_t j = j0; j < j1; j += kCols) {
    const int64_t nj = (j1 - j) < kCols ? (j1 - j) : kCols;
    const int16_t* w[kCols];
    for (int c = 0; c < kCols; ++c) {
      const int64_t n = j + (c < nj ? c : 0);  // past the last column: the first again, not stored
      if (c < nj) prim::widen(a, n, widened.data() + c * a.K);
      w[c] = widened.data() + (c < nj ? c : 0) * a.K;
      for (int64_t g = 0; g < a.groups; ++g) {
        st[g * kCols + c] = a.scales[n * a.groups + g];
        if (a.zp) zt[g * kCols + c] = a.zp[n * a.groups + g];
      }
    }
    const int32_t* z = a.zp ? zt.data() : nullptr;
    int64_t m = 0;
    for (; m + 2 <= a.M; m += 2) rows_block<2>(a, r, m, j, nj, w, st.data(), z);
    if (m < a.M) rows_block<1>(a, r, m, j, nj, w, st.data(), z);
  }
}

#if defined(ETFUSE_DQ_Q8)
// The int8-row paths (x86's q4, ARM's sdot): rows [m0, m1) of A -> qx (int8, in the primitives'
// order), their scales, zero points and the sums of qx over each group.
inline void quantize_rows_q8(const Args& a, int64_t m0, int64_t m1, int8_t* q, float* scale, int32_t* zx,
                             int32_t* qsum) {
  const int64_t G = a.K / a.groups;
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = a.A + m * a.a_rs;
    const RowQparams p = qparams_of(row, a.K);
    prim::quantize_q8(row, a.K, G, p.inv, p.zp, q + m * a.K, qsum + m * a.groups);
    scale[m] = p.scale;
    zx[m] = static_cast<int32_t>(p.zp);
  }
}
#endif

#if defined(ETFUSE_DQ_Q4)
// The q4 path (int4 weights, groups of 32 or a multiple of 64) on quantize_rows_q8's rows.

template <int R, bool kG32>
ETFUSE_ALWAYS_INLINE void rows_q4(const Args& a, const Rows& r, int64_t m, int64_t j, int64_t nj) {
  for (int64_t n = j; n < j + nj; ++n) {
    float d[R];
    prim::dot_q4<R, kG32>(a, r, m, n, d);
    for (int i = 0; i < R; ++i) store_q8(a, r, m + i, n, d[i]);
  }
}

// Columns [j0, j1) of C for every row: per block of kCols weight rows (in L1), prim::kQ4Rows rows
// of A at a time, each weight row's nibbles unpacked in registers once for them.
template <bool kG32>
inline void cols_q4_of(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  constexpr int R = prim::kQ4Rows;
  for (int64_t j = j0; j < j1; j += kCols) {
    const int64_t nj = (j1 - j) < kCols ? (j1 - j) : kCols;
    int64_t m = 0;
    for (; m + R <= a.M; m += R) rows_q4<R, kG32>(a, r, m, j, nj);
    if (R > 2) {
      for (; m + 2 <= a.M; m += 2) rows_q4<2, kG32>(a, r, m, j, nj);
    }
    for (; m < a.M; ++m) rows_q4<1, kG32>(a, r, m, j, nj);
  }
}

inline void cols_q4(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  if (a.K / a.groups == 32) {
    cols_q4_of<true>(a, r, j0, j1);
  } else {
    cols_q4_of<false>(a, r, j0, j1);
  }
}
#endif

}  // namespace ETFUSE_DQ_NS

#undef ETFUSE_DQ_NS
#undef ETFUSE_DQ_PRIMITIVES
#undef ETFUSE_DQ_Q8
#undef ETFUSE_DQ_Q4
