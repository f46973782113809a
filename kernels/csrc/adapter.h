// The one adapter between the kernel cores (core/*.h: raw pointers, Layouts, a Status) and the
// two dispatchers. Every op file under ops/ is compiled twice:
//
//   -DETFUSE_EAGER    torch eager: at::Tensor, TORCH_CHECK errors (RuntimeError in Python),
//                     at::parallel_for, TORCH_LIBRARY_IMPL(ns, CPU) registration;
//   -DETFUSE_RUNTIME  ExecuTorch runtime: executorch Tensor, ET_KERNEL_CHECK_MSG (the kernel
//                     fails, Method::execute returns an error, the process lives on), the
//                     etfuse's spinning pool (spin_pool.h) sized like the ExecuTorch
//                     threadpool, EXECUTORCH_LIBRARY registration.
//
// An op body is written once against the names below: `Tensor`, `OptTensor`, `IntList`,
// `ScalarType`, `Str`, `Context`, `Parallel`, `ETFUSE_CHECK`, `Out` and `ETFUSE_REGISTER`.
//
// The `out` contract (the same in both builds, decided here): `out` is resized to the op's
// shape (failing when it cannot be: a static shape, a rank change, above its upper bound);
// an `out` with several elements at one address is an error; an `out` that overlaps an input
// (other than being exactly it, for element-wise ops) or whose strides the core cannot write
// is computed into a contiguous temporary and copied into `out`.
//
// Everything here is `inline` in a named namespace: one definition per library, hidden like
// the rest (-fvisibility=hidden -fvisibility-inlines-hidden).
#pragma once

#if defined(ETFUSE_EAGER) == defined(ETFUSE_RUNTIME)
#error "compile the op files with exactly one of -DETFUSE_EAGER, -DETFUSE_RUNTIME"
#endif

#include <cstring>
#include <optional>
#include <vector>

#include "core/common.h"

#if defined(ETFUSE_EAGER)
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#else
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include "spin_pool.h"
#endif

namespace etfuse {
namespace adapter {

using core::Layout;
using core::Status;

#if defined(ETFUSE_EAGER)
using Tensor = at::Tensor;
using ScalarType = at::ScalarType;
using Scalar = at::Scalar;
using IntList = at::IntArrayRef;
using Half = at::Half;
using Str = c10::string_view;  // a `str` argument
struct Context {};

// The cores' parallel_for: at::parallel_for (parallel only with -fopenmp), which picks its own chunks.
struct Parallel {
  int chunks_per_thread = 2;  // the runtime build's (below); unused here

  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    at::parallel_for(begin, end, core::balanced_grain(end - begin, grain), fn);
  }
};

inline const char* dtype_name(ScalarType t) {
  return c10::toString(t);
}
inline double scalar_value(const Scalar& s) {
  return s.toDouble();
}
inline bool scalar_is_real(const Scalar& s) {
  return !s.isComplex() && !s.isBoolean();
}

// Fail the kernel with the core's message.
#define ETFUSE_CHECK(ctx, ok, st, out) TORCH_CHECK((ok), (st).msg)

#else
using Tensor = executorch::aten::Tensor;
using ScalarType = executorch::aten::ScalarType;
using Scalar = executorch::aten::Scalar;
using IntList = executorch::aten::ArrayRef<int64_t>;
using Half = executorch::aten::Half;
using Str = executorch::aten::string_view;  // a `str` argument
using Context = executorch::runtime::KernelRuntimeContext;

// The cores' parallel_for: etfuse's spinning pool (spin_pool.h says why not the ExecuTorch
// threadpool), as many threads as the ExecuTorch threadpool has. Chunks of at least `grain`,
// about chunks_per_thread a thread: two by default, so a worker that arrives late still finds one
// to take; more where a chunk's tail is what costs (a thread the host slows keeps the others
// waiting on its last chunk).
struct Parallel {
  int chunks_per_thread = 2;

  template <class F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    const int threads = static_cast<int>(executorch::extension::get_thread_count());  // >= 1
    const int64_t parts = static_cast<int64_t>(chunks_per_thread) * threads;
    const int64_t n = end - begin, per = (n + parts - 1) / parts;
    int64_t chunk = core::balanced_grain(n, grain);
    if (chunk < per) chunk = core::balanced_grain(n, per);
    // a whole number of chunks per thread: 3 chunks on 2 threads take 2 chunks' time, 4 smaller
    // ones 2 (the tiny llama's 288 -> 512 output layer); the pool cuts [begin, end) into that
    // many near-equal chunks (9 panels as 3 + 2 + 2 + 2, not 3 chunks of 3)
    int64_t chunks = (n + chunk - 1) / chunk;
    if (chunks > 1 && chunks % threads) chunks = std::min(n, (chunks + threads - 1) / threads * threads);
    pool::instance().run(begin, end, chunks, threads, &call<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  template <class F>
  static void call(void* fn, int64_t b, int64_t e) {
    (*static_cast<const F*>(fn))(b, e);
  }
};

inline const char* dtype_name(ScalarType t) {
  return executorch::runtime::toString(t);
}
inline double scalar_value(const Scalar& s) {
  return s.isFloatingPoint() ? s.to<double>() : static_cast<double>(s.to<int64_t>());
}
inline bool scalar_is_real(const Scalar& s) {
  return s.isFloatingPoint() || s.isIntegral(false);
}

#define ETFUSE_CHECK(ctx, ok, st, out) ET_KERNEL_CHECK_MSG(ctx, (ok), InvalidArgument, out, "%s", (st).msg)
#endif

using OptTensor = std::optional<Tensor>;

inline bool has(const OptTensor& t) {
#if defined(ETFUSE_EAGER)
  return t.has_value() && t->defined();
#else
  return t.has_value();
#endif
}

inline size_t element_size(const Tensor& t) {
  return static_cast<size_t>(t.element_size());
}

inline bool layout_of(const Tensor& t, const char* what, Layout& l, Status& st) {
  return core::make_layout(l, t.dim(), t.sizes().data(), t.strides().data(), what, st);
}

inline bool check_cpu(const char* op, const char* name, const Tensor& t, Status& st) {
#if defined(ETFUSE_EAGER)
  if (!t.defined()) return st.fail("%s: %s is undefined", op, name);
  if (!t.device().is_cpu()) return st.fail("%s: %s must be a CPU tensor, got %s", op, name, t.device().str().c_str());
#else
  (void)op, (void)name, (void)t, (void)st;
#endif
  return true;
}

inline bool check_float(const char* op, const char* name, const Tensor& t, Status& st) {
  if (!check_cpu(op, name, t, st)) return false;
  if (t.scalar_type() == ScalarType::Float) return true;
  return st.fail("%s: %s must be float32, got %s (etfuse kernels support float32 only)", op, name,
                 dtype_name(t.scalar_type()));
}

// Copies a strided tensor of `l` into contiguous `dst` (or back: `to_strided`), element by element.
inline void copy_strided(const char* base, const Layout& l, char* flat, size_t esize, bool to_strided) {
  const int64_t n = l.numel();
  int64_t idx[core::kMaxDims] = {0};
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    char* strided = const_cast<char*>(base) + off * static_cast<int64_t>(esize);
    if (to_strided) {
      std::memcpy(strided, flat + e * esize, esize);
    } else {
      std::memcpy(flat + e * esize, strided, esize);
    }
    for (int d = l.ndim - 1; d >= 0; --d) {
      off += l.strides[d];
      if (++idx[d] < l.sizes[d]) break;
      off -= l.strides[d] * l.sizes[d];
      idx[d] = 0;
    }
  }
}

inline Layout contiguous_layout(const Layout& l) {
  Layout c = l;
  int64_t s = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    c.strides[d] = s;
    s *= l.sizes[d];
  }
  return c;
}

using core::is_contiguous;

// `name` (of layout `l`) has exactly `want`'s shape.
inline bool same_shape(const char* op, const char* name, const Layout& l, const Layout& want, Status& st) {
  bool same = l.ndim == want.ndim;
  for (int d = 0; same && d < l.ndim; ++d) same = l.sizes[d] == want.sizes[d];
  if (same) return true;
  return st.fail("%s: %s must have the output's shape %s, got %s", op, name, core::ShapeStr(want).c_str(),
                 core::ShapeStr(l).c_str());
}

// An input read through a contiguous copy when its layout does not suit the core (the same
// in both builds: a temporary buffer, filled once per call).
class Input {
 public:
  explicit Input(const Tensor& t) : t_(t) {}
  Input(const Tensor& t, const Layout& l) : t_(t), layout_(l) {}
  // Takes the layout, copying into a contiguous buffer when `copy`.
  void read(const Layout& l, bool copy) {
    layout_ = l;
    if (copy) make_contiguous();
  }
  void make_contiguous() {
    const size_t es = element_size(t_);
    copy_.resize(static_cast<size_t>(layout_.numel()) * es);
    copy_strided(static_cast<const char*>(t_.const_data_ptr()), layout_, copy_.data(), es, false);
    layout_ = contiguous_layout(layout_);
    copied_ = true;
  }
  template <class T>
  const T* data() const {
    return copied_ ? reinterpret_cast<const T*>(copy_.data()) : static_cast<const T*>(t_.const_data_ptr());
  }
  const Layout& layout() const { return layout_; }

 private:
  const Tensor& t_;
  Layout layout_;
  std::vector<char> copy_;
  bool copied_ = false;
};

// Byte range [lo, hi) a strided tensor spans (empty when it has no elements).
inline void span_of(const Tensor& t, const Layout& l, uintptr_t& lo, uintptr_t& hi) {
  lo = hi = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  if (l.numel() == 0) return;
  int64_t mn = 0, mx = 0;
  for (int d = 0; d < l.ndim; ++d) {
    const int64_t ext = (l.sizes[d] - 1) * l.strides[d];
    (ext < 0 ? mn : mx) += ext;
  }
  const int64_t es = static_cast<int64_t>(element_size(t));
  lo += mn * es;
  hi += (mx + 1) * es;
}

// The destination of a kernel: `out` itself or a contiguous temporary (see the contract above).
class Out {
 public:
  explicit Out(Tensor& out) : out_(out) {}

  // Resizes out to sizes[0:ndim] and reads its layout.
  bool resize(const char* op, int ndim, const int64_t* sizes, Status& st) {
#if defined(ETFUSE_EAGER)
    (void)op;
    at::native::resize_output(out_, at::IntArrayRef(sizes, ndim));
#else
    const executorch::runtime::Error err =
        executorch::runtime::resize_tensor(out_, executorch::aten::ArrayRef<int64_t>(sizes, ndim));
    if (err != executorch::runtime::Error::Ok) {
      Layout cur;
      Status ignore;
      layout_of(out_, "out", cur, ignore);
      return st.fail("%s: cannot resize out from %s to %s (static shape, rank change or above its upper bound)", op,
                     core::ShapeStr(cur).c_str(), core::ShapeStr(sizes, ndim).c_str());
    }
#endif
    return layout_of(out_, "out", layout_, st);
  }

  const Layout& layout() const { return layout_; }

  // Decides where the core writes. `layout_ok`: the core can write out's strides;
  // `elementwise`: out may be exactly an input (same address and strides).
  bool open(std::initializer_list<const Tensor*> inputs, bool elementwise, bool layout_ok, Status& st) {
#if defined(ETFUSE_EAGER)
    at::assert_no_internal_overlap(out_);
#else
    for (int d = 0; d < layout_.ndim; ++d) {
      if (layout_.sizes[d] > 1 && layout_.strides[d] == 0) {
        return st.fail("unsupported operation: more than one element of the written-to tensor refers to a single "
                       "memory location. Please clone() the tensor before performing the operation.");
      }
    }
#endif
    (void)st;
    bool direct = layout_ok;
    for (const Tensor* t : inputs) direct = direct && !(t && overlaps(*t, elementwise));
    if (direct || layout_.numel() == 0) return true;
    const size_t es = element_size(out_);
    temp_.resize(static_cast<size_t>(layout_.numel()) * es);
    write_layout_ = contiguous_layout(layout_);
    use_temp_ = true;
    return true;
  }

  template <class T>
  T* data() {
    return use_temp_ ? reinterpret_cast<T*>(temp_.data()) : static_cast<T*>(out_.mutable_data_ptr());
  }
  void* raw() { return use_temp_ ? static_cast<void*>(temp_.data()) : out_.mutable_data_ptr(); }
  // The layout the core writes (out's, or the temporary's).
  const Layout& write_layout() const { return use_temp_ ? write_layout_ : layout_; }

  // Copies the temporary into out.
  Tensor& finish() {
    if (use_temp_) {
      copy_strided(static_cast<char*>(out_.mutable_data_ptr()), layout_, temp_.data(), element_size(out_), true);
    }
    return out_;
  }

 private:
  bool overlaps(const Tensor& in, bool elementwise) const {
    Layout li;
    Status ignore;
    if (!layout_of(in, "input", li, ignore) || li.numel() == 0 || layout_.numel() == 0) return false;
    if (elementwise && in.const_data_ptr() == out_.const_data_ptr() && li.ndim == layout_.ndim) {
      bool same = true;
      for (int d = 0; same && d < li.ndim; ++d) same = li.sizes[d] == layout_.sizes[d] && li.strides[d] == layout_.strides[d];
      if (same) return false;  // exactly the input: element-wise kernels read each element before writing it
    }
    uintptr_t a0, a1, b0, b1;
    span_of(in, li, a0, a1);
    span_of(out_, layout_, b0, b1);
    return a0 < b1 && b0 < a1;
  }

  Tensor& out_;
  Layout layout_, write_layout_;
  bool use_temp_ = false;
  std::vector<char> temp_;
};

// Reads a 1-element-per-row tensor ([N] or [N, 1]) of any real dtype as floats into out[0, N).
inline bool row_values(const char* op, const char* name, const Tensor& t, int64_t n, float* out, Status& st) {
  if (t.numel() != n || !(t.dim() == 1 || (t.dim() == 2 && t.size(1) == 1))) {
    return st.fail("%s: %s must be [N] or [N, 1] (per row), got %lld elements for N = %lld rows", op, name,
                   (long long)t.numel(), (long long)n);
  }
  const int64_t stride = n ? t.strides()[0] : 1;
  switch (t.scalar_type()) {
#define ETFUSE_ROWS(CT, ST)                                                      \
  case ScalarType::ST: {                                                         \
    const CT* p = t.template const_data_ptr<CT>();                               \
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i * stride]); \
    return true;                                                                 \
  }
    ETFUSE_ROWS(float, Float)
    ETFUSE_ROWS(Half, Half)
    ETFUSE_ROWS(double, Double)
    ETFUSE_ROWS(int8_t, Char)
    ETFUSE_ROWS(uint8_t, Byte)
    ETFUSE_ROWS(int32_t, Int)
    ETFUSE_ROWS(int64_t, Long)
#undef ETFUSE_ROWS
    default:
      return st.fail("%s: %s has unsupported dtype %s", op, name, dtype_name(t.scalar_type()));
  }
}

inline bool row_values(const char* op, const char* name, const Tensor& t, int64_t n, std::vector<float>& out,
                       Status& st) {
  out.resize(static_cast<size_t>(n));
  return row_values(op, name, t, n, out.data(), st);
}

#if defined(ETFUSE_EAGER)
// torch eager kernels take no context: a wrapper drops it.
template <class Sig, Sig Fn>
struct WithoutContext;
template <class R, class... A, R (*Fn)(Context&, A...)>
struct WithoutContext<R (*)(Context&, A...), Fn> {
  static R call(A... args) {
    Context ctx;
    return Fn(ctx, std::forward<A>(args)...);
  }
};
#endif

}  // namespace adapter
}  // namespace etfuse

// Registers `fn` (Tensor& fn(Context&, args..., Tensor& out)) as the kernel of `ns::name`.
#if defined(ETFUSE_EAGER)
#define ETFUSE_REGISTER(ns, name, fn)                                                                    \
  TORCH_LIBRARY_IMPL(ns, CPU, m) {                                                                       \
    m.impl(name, TORCH_FN((::etfuse::adapter::WithoutContext<decltype(&fn), &fn>::call)));               \
  }
#else
#define ETFUSE_REGISTER(ns, name, fn) EXECUTORCH_LIBRARY(ns, name, fn)
#endif
