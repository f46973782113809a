// A strided gather into a contiguous buffer (etfuse::permute_copy), any element size:
//
//   out (contiguous, sizes[0:ndim]) = the tensor at `src` read with strides[0:ndim]
//
// Dimensions that stay adjacent in both layouts are merged first, so a permute that keeps the
// last dimension in place ([0, 2, 1, 3] of a head split) copies whole runs with memcpy; otherwise
// the innermost loop is a strided gather. The portable permute_copy computes every element's
// source index from scratch. Work is split over the outer rows.
#pragma once

#include <cstring>

#include "common.h"

namespace etfuse {
namespace core {
namespace copy {

struct Plan {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {0};
  int64_t strides[kMaxDims] = {0};  // in elements of the source
};

// The read of the source in output order, dimensions of size 1 dropped and adjacent ones merged.
inline Plan plan(int ndim, const int64_t* sizes, const int64_t* strides) {
  Plan p;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;
    if (p.ndim > 0 && p.strides[p.ndim - 1] == strides[d] * sizes[d]) {  // merges with the previous dim
      p.sizes[p.ndim - 1] *= sizes[d];
      p.strides[p.ndim - 1] = strides[d];
      continue;
    }
    p.sizes[p.ndim] = sizes[d];
    p.strides[p.ndim] = strides[d];
    ++p.ndim;
  }
  if (p.ndim == 0) {  // a single element
    p.ndim = 1;
    p.sizes[0] = 1;
    p.strides[0] = 1;
  }
  return p;
}

template <size_t E>
inline void gather_rows(const Plan& p, const char* src, char* dst, int64_t r0, int64_t r1) {
  const int last = p.ndim - 1;
  const int64_t inner = p.sizes[last], is = p.strides[last];
  for (int64_t r = r0; r < r1; ++r) {
    int64_t off = 0, rem = r;
    for (int d = last - 1; d >= 0; --d) {
      off += (rem % p.sizes[d]) * p.strides[d];
      rem /= p.sizes[d];
    }
    const char* s = src + off * static_cast<int64_t>(E);
    char* o = dst + r * inner * static_cast<int64_t>(E);
    if (is == 1) {
      std::memcpy(o, s, static_cast<size_t>(inner) * E);
    } else {
      for (int64_t j = 0; j < inner; ++j) std::memcpy(o + j * E, s + j * is * static_cast<int64_t>(E), E);
    }
  }
}

// Copies into contiguous `dst`; `esize` 1, 2, 4 or 8 bytes.
template <class Par>
inline void gather(const Plan& p, const char* src, char* dst, size_t esize, Par&& par) {
  int64_t rows = 1;
  for (int d = 0; d < p.ndim - 1; ++d) rows *= p.sizes[d];
  const int64_t inner = p.sizes[p.ndim - 1];
  if (rows * inner == 0) return;
  int64_t grain = (int64_t(1) << 16) / (inner > 0 ? inner : 1);  // about 64K elements per chunk
  if (grain < 1) grain = 1;
  auto body = [&](int64_t r0, int64_t r1) {
    switch (esize) {
      case 1: return gather_rows<1>(p, src, dst, r0, r1);
      case 2: return gather_rows<2>(p, src, dst, r0, r1);
      case 4: return gather_rows<4>(p, src, dst, r0, r1);
      default: return gather_rows<8>(p, src, dst, r0, r1);
    }
  };
  if (rows <= grain) {
    body(0, rows);
  } else {
    par(0, rows, grain, body);
  }
}

}  // namespace copy
}  // namespace core
}  // namespace etfuse
