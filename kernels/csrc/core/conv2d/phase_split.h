// The phase planes (PhaseGeom): each zero-padded input plane split into stride_h x stride_w
// planes, so that every tap of a strided or dilated conv reads one plane shifted by a constant;
// split whole per group for the direct conv (split_phases), by rows into each task's buffer for
// the phase-plane GEMM (split_rows_avx2 / split_rows_avx512).
#pragma once

#include "core/conv2d/common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif

namespace etfuse {
namespace core {
namespace conv2d {

namespace detail {

// The phase planes' geometry (direct_planes): SH x SW planes, sh * sw of them per input channel.
struct PhaseGeom {
  int64_t SH, SW, plane, channel;
  explicit PhaseGeom(const Problem& pb) {
    const Params& p = pb.p;
    SH = pb.lo.sizes[2] + (pb.lw.sizes[2] - 1) * p.dilation[0] / p.stride[0];
    SW = pb.lo.sizes[3] + (pb.lw.sizes[3] - 1) * p.dilation[1] / p.stride[1];
    plane = SH * SW;
    channel = p.stride[0] * p.stride[1] * plane;
    reach = (pb.lw.sizes[2] - 1) * p.dilation[0] / p.stride[0];
  }
  int64_t reach;  // the phase rows below an output row that its taps read
  // tap[(c * KH + kh) * KW + kw]: where tap (kh, kw) of channel c reads in the phase planes at
  // `phases` (Cg channels, each `chan` floats, its planes `pl` apart; the whole planes by
  // default): output q = oh * SW + ow reads tap[k][q].
  void taps(const Problem& pb, const float* phases, const float** tap) const { taps(pb, phases, tap, plane, channel); }
  void taps(const Problem& pb, const float* phases, const float** tap, int64_t pl, int64_t chan) const {
    const Params& p = pb.p;
    const int64_t Cg = pb.li.sizes[1] / p.groups, KH = pb.lw.sizes[2], KW = pb.lw.sizes[3];
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t a = kh * p.dilation[0] % p.stride[0], b = kw * p.dilation[1] % p.stride[1];
          tap[(c * KH + kh) * KW + kw] = phases + c * chan + (a * p.stride[1] + b) * pl +
              (kh * p.dilation[0] / p.stride[0]) * SW + kw * p.dilation[1] / p.stride[1];
        }
  }
};

// Which phase rows a split writes, and where: rows [i0, i1) of every phase plane, the planes
// `plane` floats apart and the channels `channel`; with `pad`, the padding positions of those
// rows are written too (zeros), else only the input positions (the buffer zeroed once).
struct PhaseRows {
  int64_t i0, i1, plane, channel;
  bool pad;
};

// Input channels [c0, c1) of image n, group `group` into their phase planes at `phases`: rows
// `r` (PhaseRows) of them, or the whole planes of g.channel floats, zeroed beforehand (only the
// input positions are written). W: the vector width of the row moves.
template <int W>
ETFUSE_ALWAYS_INLINE void split_phase_rows(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, int64_t c0,
                                           int64_t c1, float* phases, const PhaseRows& r) {
  const Params& p = pb.p;
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3], Cg = pb.li.sizes[1] / p.groups;
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t ihs = pb.li.strides[2], iws = pb.li.strides[3];
  for (int64_t a = 0; a < sh; ++a) {
    // phase (a, b) holds input rows i * sh + a - ph in [0, H), columns j * sw + b - pw in [0, Wd)
    int64_t ilo, ihi;
    valid_range(a - ph, sh, H, g.SH, ilo, ihi);
    for (int64_t b = 0; b < sw; ++b) {
      int64_t jlo, jhi;
      valid_range(b - pw, sw, Wd, g.SW, jlo, jhi);
      const int64_t jn = jhi - jlo;
      const int64_t rlo = ilo > r.i0 ? ilo : r.i0, rhi = ihi < r.i1 ? ihi : r.i1;
      for (int64_t c = c0; c < c1; ++c) {
        const float* src = pb.in + n * pb.li.strides[0] + (group * Cg + c) * pb.li.strides[1];
        float* dst = phases + c * r.channel + (a * sw + b) * r.plane - r.i0 * g.SW;  // row i at dst + i * SW
        const float* from = src + (b - pw + jlo * sw) * iws;
        // the rows of padding above and below, and the columns left and right of the input
        for (int64_t i = r.pad ? r.i0 : rlo; i < rlo; ++i) zero_row<W>(dst + i * g.SW, g.SW);
        for (int64_t i = rlo; i < rhi; ++i) {
          const float* row = from + (i * sh + a - ph) * ihs;
          float* d = dst + i * g.SW;
          if (r.pad) {
            zero_row<W>(d, jlo);
            zero_row<W>(d + jhi, g.SW - jhi);
          }
          d += jlo;
          if (sw == 1 && iws == 1) {
            copy_row<W>(d, row, jn);  // inline: a libc call per short row was 13% of a 16 -> 16 conv on 32x32
          } else if (sw == 2 && iws == 1) {
            for (int64_t j = 0; j < jn; ++j) d[j] = row[2 * j];  // a constant step GCC vectorises
          } else {
            for (int64_t j = 0; j < jn; ++j) d[j] = row[j * sw * iws];
          }
        }
        for (int64_t i = rhi; i < (r.pad ? r.i1 : rhi); ++i) zero_row<W>(dst + i * g.SW, g.SW);
      }
    }
  }
}

ETFUSE_ALWAYS_INLINE void split_phases(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, int64_t c0,
                                       int64_t c1, float* phases) {
  split_phase_rows<4>(pb, g, n, group, c0, c1, phases, PhaseRows{0, g.SH, g.plane, g.channel, false});
}

#if ETFUSE_HAVE_X86_DISPATCH
// split_phase_rows for the phase-plane GEMM's tasks (AVX2 and up), in the selected ISA's
// vectors (compiled once per library in core/kernels.cpp). In SSE2 moves it took a third of
// ResNet8's phase-plane convs on the runtime (a task's 160 rows of 34 floats: 2.6 of 11 us).
ETFUSE_TARGET_AVX2 void split_rows_avx2(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                        const PhaseRows& r);
ETFUSE_TARGET_AVX512 void split_rows_avx512(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                            const PhaseRows& r);
#if defined(ETFUSE_CORE_KERNELS)
ETFUSE_TARGET_AVX2 void split_rows_avx2(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                        const PhaseRows& r) {
  split_phase_rows<8>(pb, g, n, group, 0, pb.li.sizes[1] / pb.p.groups, phases, r);
}
// On AVX-512, rows read along their width at stride 1 or 2 (the phase-plane GEMM's convs):
// each plane's rows are zeroed whole, then each input row is one masked load (two and a
// permute for stride 2's even or odd columns) and one masked store per 16 columns. The generic
// loop's per-row zeroing, tails and index math cost 4 ns a row, and its stride-2 copy 8 (GCC's
// AVX-512 gather of even columns on rows of 8-16): ResNet8's 32 -> 64 stride-2 split 9.3 -> 2.4 us, 64 -> 64 on 8x8 2.5 -> 0.9.
//
// The masks that move m <= 16 columns of a row: `out` the m columns written; at stride 2, `lo`
// and `hi` the 2m - 1 input floats read, in two vectors.
struct RowMasks {
  __mmask16 out, lo, hi;
  explicit RowMasks(int64_t m) {
    const int64_t need = 2 * m - 1;
    out = static_cast<__mmask16>((1u << m) - 1u);
    lo = static_cast<__mmask16>((1u << (need < 16 ? need : 16)) - 1u);
    hi = static_cast<__mmask16>((1u << (need > 16 ? need - 16 : 0)) - 1u);
  }
};
ETFUSE_TARGET_AVX512 void split_rows_avx512(const Problem& pb, const PhaseGeom& g, int64_t n, int64_t group, float* phases,
                                            const PhaseRows& r) {
  const Params& p = pb.p;
  const int64_t Cg = pb.li.sizes[1] / p.groups;
  if (!r.pad || pb.li.strides[3] != 1 || p.stride[1] > 2) {
    split_phase_rows<16>(pb, g, n, group, 0, Cg, phases, r);
    return;
  }
  const int64_t H = pb.li.sizes[2], Wd = pb.li.sizes[3];
  const int64_t sh = p.stride[0], sw = p.stride[1], ph = p.padding[0], pw = p.padding[1];
  const int64_t ihs = pb.li.strides[2];
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const int64_t span = (r.i1 - r.i0) * g.SW;  // a plane's rows in the buffer, contiguous
  for (int64_t a = 0; a < sh; ++a) {
    int64_t ilo, ihi;
    valid_range(a - ph, sh, H, g.SH, ilo, ihi);
    const int64_t rlo = ilo > r.i0 ? ilo : r.i0, rhi = ihi < r.i1 ? ihi : r.i1;
    for (int64_t b = 0; b < sw; ++b) {
      int64_t jlo, jhi;
      valid_range(b - pw, sw, Wd, g.SW, jlo, jhi);
      const int64_t jn = jhi - jlo;
      for (int64_t c = 0; c < Cg; ++c) {
        const float* src = pb.in + n * pb.li.strides[0] + (group * Cg + c) * pb.li.strides[1] + (b - pw + jlo * sw);
        float* dst = phases + c * r.channel + (a * sw + b) * r.plane;
        zero_row<16>(dst, span);
        if (jn <= 0) continue;
        if (jn <= 16) {  // one vector a row (maps up to 16 wide, 32 at stride 2): the masks hoisted
          const RowMasks k(jn);
          const __mmask16 out = k.out, lo = k.lo, hi = k.hi;
          const float* row = src + (rlo * sh + a - ph) * ihs;
          float* d = dst + (rlo - r.i0) * g.SW + jlo;
          if (sw == 1) {
            for (int64_t i = rlo; i < rhi; ++i, row += sh * ihs, d += g.SW) _mm512_mask_storeu_ps(d, out, _mm512_maskz_loadu_ps(out, row));
          } else {
            for (int64_t i = rlo; i < rhi; ++i, row += sh * ihs, d += g.SW) {
              const __m512 v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo, row), even, _mm512_maskz_loadu_ps(hi, row + 16));
              _mm512_mask_storeu_ps(d, out, v);
            }
          }
          continue;
        }
        for (int64_t i = rlo; i < rhi; ++i) {
          const float* row = src + (i * sh + a - ph) * ihs;
          float* d = dst + (i - r.i0) * g.SW + jlo;
          for (int64_t j = 0; j < jn; j += 16) {
            const RowMasks k(jn - j < 16 ? jn - j : 16);
            const __m512 v = sw == 1 ? _mm512_maskz_loadu_ps(k.out, row + j)
                                     : _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(k.lo, row + 2 * j), even,
                                                              _mm512_maskz_loadu_ps(k.hi, row + 2 * j + 16));
            _mm512_mask_storeu_ps(d + j, k.out, v);
          }
        }
      }
    }
  }
}
#endif
#endif  // ETFUSE_HAVE_X86_DISPATCH

}  // namespace detail

}  // namespace conv2d
}  // namespace core
}  // namespace etfuse
