// Shared plumbing for the etfuse kernel cores.
//
// Plain C++17 on raw pointers, sizes and strides: no torch or executorch types. The op files
// (ops/*.cpp, through adapter.h, once for torch eager and once for the ExecuTorch runtime)
// translate their tensors into `Layout`s, ask the core for the output shape and for
// validation (errors come back as a `Status` with a message), and run the core with their
// own parallel_for (any callable `par(begin, end, grain, fn)` with `fn(begin, end)`).
#pragma once

#include <vector>

#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/isa.h"

#if defined(__GNUC__)
#define ETFUSE_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ETFUSE_ALWAYS_INLINE inline
#endif

// Runtime ISA dispatch (core/isa.h): the library is built for the x86-64 baseline (SSE2) and
// carries extra copies of the hot loops compiled for AVX2+FMA(+F16C) and AVX-512, or on aarch64
// NEON micro-kernels (and dot-product ones), each family choosing its copy by selected_isa() in
// one `*_kernels()` table. The x86 copies and their declarations exist only under
// ETFUSE_HAVE_X86_DISPATCH, so a dispatch left unguarded fails to compile elsewhere instead of
// failing to link.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ETFUSE_HAVE_X86_DISPATCH 1
#define ETFUSE_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ETFUSE_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define ETFUSE_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#else
#define ETFUSE_HAVE_X86_DISPATCH 0
#endif
// aarch64: NEON (Advanced SIMD) is part of the architecture; the NEON micro-kernels are the
// default there and the portable code stays reachable as "baseline".
#if defined(__aarch64__)
#define ETFUSE_HAVE_ARM_NEON 1
#else
#define ETFUSE_HAVE_ARM_NEON 0
#endif

// For the loops that must round every float32 step (the quantized ones, bit-exact with the
// decomposed ops): GCC contracts a * b + c into an FMA even across statements, and aarch64's
// baseline has FMA (x86 compiles those loops without FMA; Clang contracts only within one
// expression). It goes on the outermost non-inline function holding the arithmetic: such a
// function is not inlined into callers without it, and lambdas do not inherit it.
#if defined(__GNUC__) && !defined(__clang__) && !ETFUSE_HAVE_X86_DISPATCH
#define ETFUSE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define ETFUSE_NO_FP_CONTRACT
#endif

namespace etfuse {
namespace core {

constexpr int kMaxDims = 16;
// Elements per parallel task for memory-bound loops (at::internal::GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;
// Memory-bound loops up to this many elements run on the calling thread.
constexpr int64_t kSerialElements = 2 * kGrainSize;
// GEMMs and convolutions whose work is under this many multiply-adds' worth (about 12 us on one
// AVX-512 core) run on the calling thread. The work counts the multiply-adds, plus 16 for each
// operand element read (a weight streamed from L2 or L3 takes about as long per element as 16
// multiply-adds: MobileNetV2's 160 -> 960 1x1 on 3x3, 1.4 M multiply-adds and 600 KB of weight,
// 35 us on one thread and 23 on two). Splitting an op moves its data between cores: on the
// 2-vCPU machines measured here a 32 KB tensor written by the other core took 3 us to read, 0.3
// us from this core's cache, and the op after a split one reads half its input that way.
// Measured on the runtime (us, 1 thread vs 2 split): DS-CNN's 64 -> 64 1x1 on 25x5 8.5 vs 12.1,
// its depthwise 3x3 5.1 vs 6.6; MobileNetV2's 144 -> 32 1x1 on 12x12 11.2 vs 12.8, 192 -> 64 on
// 6x6 8.8 vs 10.6; but 384 -> 64 on 6x6 17.4 vs 16.1.
constexpr int64_t kParallelMinMacs = int64_t(1) << 20;
constexpr int64_t kMacsPerElement = 16;

// A parallel_for that runs everything on the calling thread when `serial`.
template <class Par>
struct SerialBelow {
  Par& par;
  bool serial;
  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    if (serial) {
      fn(begin, end);
    } else {
      par(begin, end, grain, fn);
    }
  }
};

// The grain that splits n items into as many chunks as `grain` does, of equal size. Both
// parallel_fors (ExecuTorch's and ATen's) cut a range into chunks of max(grain, n / threads):
// 64 depthwise planes at a grain of 58 ran as 58 + 6, one thread doing nearly all the work.
inline int64_t balanced_grain(int64_t n, int64_t grain) {
  if (grain < 1) grain = 1;
  const int64_t chunks = (n + grain - 1) / grain;
  return chunks > 1 ? (n + chunks - 1) / chunks : grain;
}

// fn(begin, end) over [0, n): inline when small, else split through `par`.
template <class Par, class F>
inline void for_elements(int64_t n, Par&& par, const F& fn) {
  if (n <= kSerialElements) {
    fn(int64_t(0), n);
    return;
  }
  par(int64_t(0), n, kGrainSize, fn);
}

struct Status {
  bool ok = true;
  char msg[512] = {0};

  bool fail(const char* fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 2, 3)))
#endif
  {
    ok = false;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return false;
  }
};

// Sizes and strides (in elements) of one tensor. Only [0, ndim) is defined: an op builds and
// copies a dozen Layouts per call, and zeroing or copying all kMaxDims entries (264 bytes, `rep
// stos` / `rep movs`) was about 0.2 us of a small op's 2-3 us on the runtime.
struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];

  Layout() {
#if defined(ETFUSE_POISON_LAYOUT)
    for (int d = 0; d < kMaxDims; ++d) sizes[d] = strides[d] = -(int64_t(1) << 40);
#endif
  }
  Layout(const Layout& o) : ndim(o.ndim) { copy_dims(o); }
  Layout& operator=(const Layout& o) {
    ndim = o.ndim;
    copy_dims(o);
    return *this;
  }
  void copy_dims(const Layout& o) {
    for (int d = 0; d < ndim; ++d) {
      sizes[d] = o.sizes[d];
      strides[d] = o.strides[d];
    }
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }
  int64_t size(int d) const { return sizes[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
};

// Fill `out` from any integer arrays (torch: int64, ExecuTorch: int32). `strides` may be null
// when only a shape is known.
template <class S, class T>
inline bool make_layout(
    Layout& out, int64_t ndim, const S* sizes, const T* strides, const char* what, Status& st) {
  if (ndim < 0 || ndim > kMaxDims) {
    return st.fail("%s has %lld dimensions; etfuse kernels support at most %d", what, (long long)ndim, kMaxDims);
  }
  out.ndim = static_cast<int>(ndim);
  for (int d = 0; d < out.ndim; ++d) {
    out.sizes[d] = static_cast<int64_t>(sizes[d]);
    out.strides[d] = strides ? static_cast<int64_t>(strides[d]) : 0;
  }
  return true;
}

// "[2, 3, 4]" into buf.
inline const char* shape_str(const int64_t* sizes, int ndim, char* buf, size_t n) {
  size_t pos = 0;
  pos += std::snprintf(buf + pos, n - pos, "[");
  for (int d = 0; d < ndim && pos < n; ++d) {
    pos += std::snprintf(buf + pos, n - pos, d ? ", %lld" : "%lld", (long long)sizes[d]);
  }
  if (pos < n) std::snprintf(buf + pos, n - pos, "]");
  return buf;
}

struct ShapeStr {
  char buf[160];
  explicit ShapeStr(const Layout& l) { shape_str(l.sizes, l.ndim, buf, sizeof(buf)); }
  ShapeStr(const int64_t* sizes, int ndim) { shape_str(sizes, ndim, buf, sizeof(buf)); }
  const char* c_str() const { return buf; }
};

// NumPy broadcasting of two shapes. Writes the result rank and sizes.
inline bool broadcast_shapes(
    const Layout& a, const Layout& b, int& ndim, int64_t* sizes, const char* op, Status& st) {
  ndim = a.ndim > b.ndim ? a.ndim : b.ndim;
  for (int i = 0; i < ndim; ++i) {
    const int da = a.ndim - ndim + i, db = b.ndim - ndim + i;
    const int64_t sa = da >= 0 ? a.sizes[da] : 1, sb = db >= 0 ? b.sizes[db] : 1;
    if (sa == sb || sb == 1) {
      sizes[i] = sa;
    } else if (sa == 1) {
      sizes[i] = sb;
    } else {
      return st.fail(
          "%s: shapes %s and %s cannot be broadcast together (dimension %d: %lld vs %lld)", op,
          ShapeStr(a).c_str(), ShapeStr(b).c_str(), i, (long long)sa, (long long)sb);
    }
  }
  return true;
}

// Stride of `t` along output dimension `d` of a broadcast to an `ndim`-dimensional output:
// 0 where `t` is missing that dimension or has size 1 there.
inline int64_t broadcast_stride(const Layout& t, int ndim, int d) {
  const int dt = t.ndim - ndim + d;
  if (dt < 0 || t.sizes[dt] == 1) return 0;
  return t.strides[dt];
}

// relu that keeps NaN (like torch.relu); compiles to maxps(0, v).
ETFUSE_ALWAYS_INLINE float relu(float v) {
  return v < 0.0f ? 0.0f : v;
}

// Row-major contiguous: the numel() elements are the ones from the first on.
inline bool is_contiguous(const Layout& l) {
  int64_t expect = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    if (l.sizes[d] != 1 && l.strides[d] != expect) return false;
    expect *= l.sizes[d];
  }
  return true;
}

// n floats of `v` starting at its first 64-byte boundary (v grown to fit). A std::vector's
// buffer is 16-byte aligned, so a whole-vector buffer indexed in 64-byte steps had every AVX-512
// load split across two cache lines: the depthwise kernels' interleaved buffers (DS-CNN's 3x3 on
// 25x5, one thread, 5.0 -> 4.1 us; MobileNetV2's 96 channels on 24x24 37.5 -> 32.8).
inline float* aligned_floats(std::vector<float>& v, size_t n) {
  if (v.size() < n + 15) v.resize(n + 15);
  const size_t misalign = reinterpret_cast<uintptr_t>(v.data()) % 64;
  return v.data() + (misalign ? (64 - misalign) / sizeof(float) : 0);
}

// Whether two layouts of the same sizes put every element at the same offset (strides of
// size-1 dims do not matter).
inline bool same_strides(const Layout& a, const Layout& b) {
  for (int d = 0; d < a.ndim; ++d) {
    if (a.sizes[d] != 1 && a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

}  // namespace core
}  // namespace etfuse

// Plain C entry points exported by each library (for ctypes).
#define ETFUSE_EXPORT extern "C" __attribute__((visibility("default")))
