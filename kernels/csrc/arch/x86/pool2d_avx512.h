// max_pool2d's AVX-512 planes (core/pool2d.h declares them and picks them; compiled once per
// library, in core/kernels.cpp: -DETFUSE_CORE_KERNELS).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/pool2d.h"

namespace etfuse {
namespace core {
namespace pool2d {
namespace x86 {

using detail::kMaxRows;
using detail::kRowSlack;

// torch's max on 16 lanes: v wins when greater or NaN, and a NaN already in acc stays.
ETFUSE_TARGET_AVX512 ETFUSE_ALWAYS_INLINE __m512 max_nan16(__m512 acc, __m512 v) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q), _mm512_max_ps(acc, v), acc);
}

ETFUSE_TARGET_AVX512 void max_planes_avx512(const float* in, float* out, const detail::Plane& g, const Params& p,
                                            int64_t row_len, int64_t q0, int64_t q1) {
  const int64_t kw = p.kernel[1], sw = p.stride[1], pw = p.padding[1];
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> row(static_cast<size_t>(row_len + kRowSlack), ninf);
  float* body = row.data() + pw;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t q = q0; q < q1; ++q) {
    const float* plane = in + q * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const float* src[kMaxRows];
      const int rows = detail::window_rows(plane, g, p, oy, src);
      // reduced into body 16 columns at a time, in a register: a masked store read back by the
      // next row's pass stalled (a masked store does not forward to a load)
      for (int64_t x = 0; x < g.w; x += 16) {
        const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, g.w - x)) - 1u);
        __m512 acc = _mm512_set1_ps(ninf);  // no row inside the plane (ceil_mode): nothing to pool
        for (int r = 0; r < rows; ++r) {
          const __m512 v = _mm512_maskz_loadu_ps(m, src[r] + x);
          acc = r ? max_nan16(acc, v) : v;
        }
        _mm512_mask_storeu_ps(body + x, m, acc);
      }
      float* dst = out + q * g.oh * g.ow + oy * g.ow;
      for (int64_t ox = 0; ox < g.ow; ox += 16) {  // then along the width
        const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, g.ow - ox)) - 1u);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t kx = 0; kx < kw; ++kx) {
          const float* r = row.data() + ox * sw + kx;
          const __m512 v = sw == 1 ? _mm512_loadu_ps(r)
                                   : _mm512_permutex2var_ps(_mm512_loadu_ps(r), even, _mm512_loadu_ps(r + 16));
          acc = kx ? max_nan16(acc, v) : v;
        }
        _mm512_mask_storeu_ps(dst + ox, m, acc);
      }
    }
  }
}

}  // namespace x86
}  // namespace pool2d
}  // namespace core
}  // namespace etfuse
