// linear_dq's primitives in portable C++ (core/linear_dq.h): the reference the ISA copies are
// tested against, and what CPUs without one run. Included once, inside namespace linear_dq.
namespace portable {

ETFUSE_ALWAYS_INLINE void min_max(const float* v, int64_t n, float& mn, float& mx) {
  mn = mx = v[0];
  for (int64_t i = 1; i < n; ++i) {
    mn = v[i] < mn ? v[i] : mn;
    mx = v[i] > mx ? v[i] : mx;
  }
}

ETFUSE_ALWAYS_INLINE void quantize(const float* v, int64_t n, float inv, float zp, int16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = quantized(v[i], inv, zp);
}

// Weight row n's integer values q as int16 (zero points not subtracted).
ETFUSE_ALWAYS_INLINE void widen(const Args& a, int64_t n, int16_t* out) {
  const uint8_t* w = a.W + n * a.w_rs;
  if (a.bits == 8) {
    for (int64_t k = 0; k < a.K; ++k) out[k] = static_cast<int8_t>(w[k]);
    return;
  }
  for (int64_t c = 0; c < a.K; c += kChunk) {
    for (int64_t i = 0; i < kChunk / 2; ++i) {
      const uint8_t b = w[c / 2 + i];
      out[c + i] = static_cast<int16_t>((b & 15) - 8);
      out[c + kChunk / 2 + i] = static_cast<int16_t>((b >> 4) - 8);
    }
  }
}

// out[r][c] = sum_g st[g][c] * (sum_{k in g} x[r][k] * w[c][k] - zt[g][c] * gsum[r][g]) for R rows
// and kCols weight rows: the group's sums exact in int32, then scaled. st, zt: [groups][kCols]
// (zt null: no zero points). Groups of kG columns (0: G, known at run time only).
template <int R, int64_t kG>
ETFUSE_ALWAYS_INLINE void dot_groups_of(const int16_t* const* x, const int32_t* const* gsum, const int16_t* const* w,
                                        int64_t G_, int64_t groups, const float* st, const int32_t* zt,
                                        float (*out)[kCols]) {
  const int64_t G = kG ? kG : G_;
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kCols; ++c) {
      float tot = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t d = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) d += static_cast<int32_t>(x[r][k]) * w[c][k];
        if (zt) d -= zt[g * kCols + c] * gsum[r][g];
        tot += st[g * kCols + c] * static_cast<float>(d);
      }
      out[r][c] = tot;
    }
  }
}

}  // namespace portable
