// linear_dq's row quantization and column blocks (core/linear_dq.h) over one ISA's primitives:
// included once per ISA with ETFUSE_DQ_NS (its namespace) and ETFUSE_DQ_PRIMITIVES (the
// primitives' namespace: min_max, quantize, widen, dot_groups). No include guard, on purpose.
namespace ETFUSE_DQ_NS {

namespace prim = ETFUSE_DQ_PRIMITIVES;

// Rows [m0, m1) of A -> x, their scales and (gsum non-null) their sums over each group.
inline void quantize_rows(const Args& a, int64_t m0, int64_t m1, int16_t* x, float* scale, int32_t* gsum) {
  const int64_t G = a.K / a.groups;
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = a.A + m * a.a_rs;
    float mn, mx;
    prim::min_max(row, a.K, mn, mx);
    const RowQparams p = row_qparams(mn, mx);
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

// Columns [j0, j1) of C for every row.
inline void cols(const Args& a, const Rows& r, int64_t j0, int64_t j1) {
  const int64_t G = a.K / a.groups;
  std::vector<int16_t> scratch(static_cast<size_t>(kCols * a.K));
  for (int64_t j = j0; j < j1; j += kCols) {
    const int64_t nj = (j1 - j) < kCols ? (j1 - j) : kCols;
    const int16_t* w[kCols];
    const float* s[kCols];
    for (int c = 0; c < kCols; ++c) {
      const int64_t cc = c < nj ? c : 0;  // past the last column: the first again, not stored
      if (c < nj) prim::widen(a, j + c, scratch.data() + c * a.K);
      w[c] = scratch.data() + cc * a.K;
      s[c] = a.scales + (j + cc) * a.groups;
    }
    for (int64_t m = 0; m < a.M; ++m) {
      float sums[kCols];
      prim::dot_groups(r.x + m * a.K, w, G, a.groups, s, sums);
      for (int c = 0; c < nj; ++c) {
        const int64_t n = j + c;
        float v = sums[c];
        if (a.zp) {  // - zp * sum_{k in g} x, per group
          const int8_t* zp = a.zp + n * a.groups;
          const int32_t* gs = r.gsum + m * a.groups;
          float corr = 0.0f;
          for (int64_t g = 0; g < a.groups; ++g) corr += s[c][g] * static_cast<float>(zp[g] * gs[g]);
          v -= corr;
        }
        float y = v * r.scale[m];
        if (a.bias) y += a.bias[n];
        if (a.residual) y += a.residual[m * a.r_rs + n];
        a.C[m * a.c_rs + n] = y;
      }
    }
  }
}

}  // namespace ETFUSE_DQ_NS
