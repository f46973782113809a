// quantized_decomposed kernel cores: add, add_relu, add.scalar and the per-tensor
// quantize / dequantize that fused programs keep at their edges. int8 and uint8.
//
// Bit-exact against the decomposed ops (torch.ao quantized_decomposed, float32 throughout):
//   dequantize(q)  = (float(q) - float(zp)) * float(scale)
//   quantize(x)    = clamp(rint(x * float(1.0 / scale)) + float(zp), qmin, qmax)   (half to even)
// Each step is its own float32 operation; no step may be contracted into an FMA, so the loops
// are compiled for the baseline and for AVX2 *without* FMA (ETFUSE_TARGET_AVX2_NOFMA), and
// where the baseline has FMA (aarch64) with contraction off (ETFUSE_NO_FP_CONTRACT).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "broadcast.h"
#include "common.h"

#if ETFUSE_HAVE_X86_DISPATCH
#define ETFUSE_TARGET_AVX2_NOFMA __attribute__((target("avx2")))
#endif

namespace etfuse {
namespace core {
namespace quantized {

enum class QType { kInt8, kUInt8 };

inline const char* qtype_name(QType t) { return t == QType::kInt8 ? "int8" : "uint8"; }
inline int64_t qtype_min(QType t) { return t == QType::kInt8 ? -128 : 0; }
inline int64_t qtype_max(QType t) { return t == QType::kInt8 ? 127 : 255; }

// One tensor's per-tensor qparams, in the float32 form the arithmetic uses.
struct QParams {
  float scale = 1.0f;
  float inv_scale = 1.0f;  // float(1.0 / scale), computed in double like torch.ao's Python
  float zero_point = 0.0f;
  float qmin = 0.0f;
  float qmax = 0.0f;
};

// Validates and converts. `what` names the operand ("a", "b", "out") in the error.
inline bool make_qparams(
    const char* op, const char* what, double scale, int64_t zp, int64_t qmin, int64_t qmax, QType t, QParams& q,
    Status& st) {
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    return st.fail("%s: %s_scale must be finite and > 0, got %g", op, what, scale);
  }
  if (qmin > qmax || qmin < qtype_min(t) || qmax > qtype_max(t)) {
    return st.fail(
        "%s: %s quant range [%lld, %lld] is not inside %s's [%lld, %lld]", op, what, (long long)qmin,
        (long long)qmax, qtype_name(t), (long long)qtype_min(t), (long long)qtype_max(t));
  }
  if (zp < qmin || zp > qmax) {
    return st.fail(
        "%s: %s_zero_point %lld is outside the quant range [%lld, %lld]", op, what, (long long)zp, (long long)qmin,
        (long long)qmax);
  }
  // The arithmetic runs in float32: check the constants it uses there, not the doubles. A scale
  // whose reciprocal overflows float32 (1e-45) makes rint(0 * inf) a NaN, and converting a NaN
  // to an integer is undefined (x86 gives -128); a scale so large that (q - zp) * scale
  // overflows turns dq(a) + dq(b) into inf - inf.
  const float fscale = static_cast<float>(scale);
  const float finv = static_cast<float>(1.0 / scale);
  if (!(fscale > 0.0f) || !std::isfinite(fscale)) {
    return st.fail("%s: %s_scale %g is not a finite float32 > 0 (the kernel computes in float32)", op, what, scale);
  }
  if (!std::isfinite(finv)) {
    return st.fail(
        "%s: %s_scale %g is too small: 1/scale = %g overflows float32 (the kernel computes in float32; "
        "scale must be >= %g)", op, what, scale, 1.0 / scale, 1.0 / static_cast<double>(std::numeric_limits<float>::max()));
  }
  if (!std::isfinite(fscale * static_cast<float>(qtype_max(t) - qtype_min(t)))) {
    return st.fail("%s: %s_scale %g is too large: (q - zero_point) * scale overflows float32", op, what, scale);
  }
  q.scale = fscale;
  q.inv_scale = finv;
  q.zero_point = static_cast<float>(zp);
  q.qmin = static_cast<float>(qmin);
  q.qmax = static_cast<float>(qmax);
  return true;
}

// add.scalar's b is added in float32: a NaN would reach the integer conversion (undefined).
// +-inf is fine (it quantizes to the end of the range, like the decomposed ops).
inline bool check_scalar(const char* op, double b, Status& st) {
  if (std::isnan(static_cast<float>(b))) return st.fail("%s: b is NaN", op);
  return true;
}

// The quantized loops do ~10x the arithmetic of a float add per byte moved, so they split over
// threads from a smaller size than the memory-bound float loops (for_elements in common.h).
constexpr int64_t kQuantGrain = 16384;

template <class Par, class F>
inline void for_quantized(int64_t n, Par&& par, const F& fn) {
  if (n <= kQuantGrain) {
    fn(int64_t(0), n);
    return;
  }
  par(int64_t(0), n, kQuantGrain, fn);
}

ETFUSE_ALWAYS_INLINE float clampf(float v, float lo, float hi) {
  // torch.clamp: min(max(v, lo), hi)
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

// ---- element-wise binary (add / add_relu) and scalar add ----------------------------------

using broadcast::Plan;
using broadcast::make_plan;

inline bool check_out_shape(const char* op, const Layout& la, const Layout& lb, const Layout& lo, Status& st) {
  return broadcast::check_out(op, la, lb, lo, st);
}

template <class TA, class TB, class TO, bool kRelu>
struct BinaryLoop {
  static ETFUSE_ALWAYS_INLINE void body(
      int64_t len, const TA* __restrict a, int64_t ia, const TB* __restrict b, int64_t ib, TO* __restrict o,
      int64_t io, const QParams& qa, const QParams& qb, const QParams& qo) {
    const float sa = qa.scale, za = qa.zero_point, sb = qb.scale, zb = qb.zero_point;
    const float inv = qo.inv_scale, zo = qo.zero_point, lo = qo.qmin, hi = qo.qmax;
#define ETFUSE_QADD_ELEM(A, B)                            \
  {                                                       \
    const float x = (static_cast<float>(A) - za) * sa;    \
    const float y = (static_cast<float>(B) - zb) * sb;    \
    float s = x + y;                                      \
    if (kRelu) s = s < 0.0f ? 0.0f : s;                   \
    const float r = clampf(std::rint(s * inv) + zo, lo, hi); \
    val = static_cast<TO>(static_cast<int32_t>(r));       \
  }
    if (io == 1 && ia == 1 && ib == 1) {
      for (int64_t i = 0; i < len; ++i) {
        TO val;
        ETFUSE_QADD_ELEM(a[i], b[i]);
        o[i] = val;
      }
    } else if (io == 1 && ia == 1 && ib == 0) {
      const TB bv = *b;
      for (int64_t i = 0; i < len; ++i) {
        TO val;
        ETFUSE_QADD_ELEM(a[i], bv);
        o[i] = val;
      }
    } else if (io == 1 && ia == 0 && ib == 1) {
      const TA av = *a;
      for (int64_t i = 0; i < len; ++i) {
        TO val;
        ETFUSE_QADD_ELEM(av, b[i]);
        o[i] = val;
      }
    } else {
      for (int64_t i = 0; i < len; ++i) {
        TO val;
        ETFUSE_QADD_ELEM(a[i * ia], b[i * ib]);
        o[i * io] = val;
      }
    }
#undef ETFUSE_QADD_ELEM
  }
};

// The per-tensor quantize / dequantize loops (contiguous).
template <class TQ>
struct QdqLoop {
  static ETFUSE_ALWAYS_INLINE void quantize(int64_t n, const float* __restrict x, TQ* __restrict q, const QParams& p) {
    const float inv = p.inv_scale, zp = p.zero_point, lo = p.qmin, hi = p.qmax;
    for (int64_t i = 0; i < n; ++i) q[i] = static_cast<TQ>(static_cast<int32_t>(clampf(std::rint(x[i] * inv) + zp, lo, hi)));
  }
  static ETFUSE_ALWAYS_INLINE void dequantize(int64_t n, const TQ* __restrict q, float* __restrict x, const QParams& p) {
    const float s = p.scale, zp = p.zero_point;
    for (int64_t i = 0; i < n; ++i) x[i] = (static_cast<float>(q[i]) - zp) * s;
  }
};

}  // namespace quantized
}  // namespace core
}  // namespace etfuse

#if ETFUSE_HAVE_X86_DISPATCH
#include "arch/x86/quantized_avx2.h"
#endif

namespace etfuse {
namespace core {
namespace quantized {

template <class TA, class TB, class TO, bool kRelu>
ETFUSE_NO_FP_CONTRACT void binary_inner_base(
    int64_t len, const TA* a, int64_t ia, const TB* b, int64_t ib, TO* o, int64_t io, const QParams& qa,
    const QParams& qb, const QParams& qo) {
  BinaryLoop<TA, TB, TO, kRelu>::body(len, a, ia, b, ib, o, io, qa, qb, qo);
}

// add's inner loop on one ISA: the one place it is chosen (aarch64 runs the portable loop).
template <class TA, class TB, class TO, bool kRelu>
struct BinaryKernels {
  void (*inner)(int64_t, const TA*, int64_t, const TB*, int64_t, TO*, int64_t, const QParams&, const QParams&,
                const QParams&);
};

template <class TA, class TB, class TO, bool kRelu>
inline BinaryKernels<TA, TB, TO, kRelu> binary_kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&x86::binary_inner_avx2<TA, TB, TO, kRelu>};
#endif
    default: return {&binary_inner_base<TA, TB, TO, kRelu>};
  }
}

// Output elements [e0, e1) of the plan.
template <class TA, class TB, class TO, bool kRelu>
void binary_range(
    const Plan& p, const TA* a, const TB* b, TO* o, int64_t e0, int64_t e1, const QParams& qa, const QParams& qb,
    const QParams& qo, Isa isa) {
  const auto inner = binary_kernels<TA, TB, TO, kRelu>(isa).inner;
  broadcast::for_range(p, e0, e1, [&](int64_t len, int64_t oa, int64_t ia, int64_t ob, int64_t ib, int64_t oo, int64_t io) {
    inner(len, a + oa, ia, b + ob, ib, o + oo, io, qa, qb, qo);
  });
}

// out = q(dq(a) + dq(b)) [relu], broadcasting; the layouts are already validated.
template <class TA, class TB, class TO, class Par>
void add(
    const TA* a, const Layout& la, const TB* b, const Layout& lb, TO* o, const Layout& lo, const QParams& qa,
    const QParams& qb, const QParams& qo, bool relu, Par&& par) {
  const Plan p = make_plan(la, lb, lo);
  if (p.total == 0) return;  // the plan of an empty output has no inner run to divide by
  const Isa isa = selected_isa();
  for_quantized(p.total, par, [&](int64_t e0, int64_t e1) {
    if (relu) {
      binary_range<TA, TB, TO, true>(p, a, b, o, e0, e1, qa, qb, qo, isa);
    } else {
      binary_range<TA, TB, TO, false>(p, a, b, o, e0, e1, qa, qb, qo, isa);
    }
  });
}

// add.scalar: dq(a) + float(b). Same loop as add with b a broadcast float "tensor" of scale 1.
template <class TA, class TO, class Par>
void add_scalar(
    const TA* a, const Layout& la, TO* o, const Layout& lo, const QParams& qa, double b, const QParams& qo,
    Par&& par) {
  // x + float(b) == (float(b) - 0) * 1: exact, so the binary loop computes exactly dq(a) + float(b).
  const float bf = static_cast<float>(b);
  QParams qb;
  qb.scale = 1.0f;
  qb.zero_point = 0.0f;
  Layout lb;  // a 0-dim operand
  lb.ndim = 0;
  const Plan p = make_plan(la, lb, lo);
  if (p.total == 0) return;
  const Isa isa = selected_isa();
  for_quantized(p.total, par, [&](int64_t e0, int64_t e1) {
    binary_range<TA, float, TO, false>(p, a, &bf, o, e0, e1, qa, qb, qo, isa);
  });
}


template <class TQ>
ETFUSE_NO_FP_CONTRACT void quantize_base(int64_t n, const float* x, TQ* q, const QParams& p) {
  QdqLoop<TQ>::quantize(n, x, q, p);
}
template <class TQ>
ETFUSE_NO_FP_CONTRACT void dequantize_base(int64_t n, const TQ* q, float* x, const QParams& p) {
  QdqLoop<TQ>::dequantize(n, q, x, p);
}

// quantize / dequantize on one ISA: the one place they are chosen (aarch64 runs the portable loops).
template <class TQ>
struct QdqKernels {
  void (*quantize)(int64_t, const float*, TQ*, const QParams&);
  void (*dequantize)(int64_t, const TQ*, float*, const QParams&);
};

template <class TQ>
inline QdqKernels<TQ> qdq_kernels(Isa isa) {
  switch (isa) {
#if ETFUSE_HAVE_X86_DISPATCH
    case Isa::kAvx512Vnni:
    case Isa::kAvx512:
    case Isa::kAvx2: return {&x86::quantize_avx2<TQ>, &x86::dequantize_avx2<TQ>};
#endif
    default: return {&quantize_base<TQ>, &dequantize_base<TQ>};
  }
}

// Contiguous tensors of n elements.
template <class TQ, class Par>
void quantize(const float* x, TQ* q, int64_t n, const QParams& p, Par&& par) {
  const auto f = qdq_kernels<TQ>(selected_isa()).quantize;
  for_quantized(n, par, [&](int64_t e0, int64_t e1) { f(e1 - e0, x + e0, q + e0, p); });
}

template <class TQ, class Par>
void dequantize(const TQ* q, float* x, int64_t n, const QParams& p, Par&& par) {
  const auto f = qdq_kernels<TQ>(selected_isa()).dequantize;
  for_quantized(n, par, [&](int64_t e0, int64_t e1) { f(e1 - e0, q + e0, x + e0, p); });
}

}  // namespace quantized
}  // namespace core
}  // namespace etfuse
