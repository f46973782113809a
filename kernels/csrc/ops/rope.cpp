// etfuse::rope.out: rotary position embedding on interleaved pairs of x's last dim
// (backend_ops/rope_ops.py). Each product and sum is rounded as the edge ops round it (no FMA:
// this file is built for the baseline ISA), so the result is the pattern's bit for bit.
#include "adapter.h"

namespace {

using namespace etfuse::adapter;
using etfuse::core::broadcast_stride;
using etfuse::core::kMaxDims;

// cos or sin broadcast to `target` (x's shape with D / 2 last): its element strides per dim.
bool angle_strides(const char* op, const char* name, const Layout& l, const Layout& target, int64_t* strides,
                   Status& st) {
  bool fits = l.ndim <= target.ndim;
  for (int d = target.ndim - 1, e = l.ndim - 1; fits && e >= 0; --d, --e) {
    fits = l.sizes[e] == target.sizes[d] || l.sizes[e] == 1;
  }
  if (!fits) {
    return st.fail("%s: %s %s does not broadcast to %s (x's shape with D / 2 last)", op, name,
                   etfuse::core::ShapeStr(l).c_str(), etfuse::core::ShapeStr(target).c_str());
  }
  for (int d = 0; d < target.ndim; ++d) strides[d] = broadcast_stride(l, target.ndim, d);
  return true;
}

// bit for bit with the pattern: no fused multiply-add where the compiler would contract (ARM)
ETFUSE_NO_FP_CONTRACT Tensor& rope_out(Context& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
  constexpr const char* op = "etfuse::rope.out";
  Status st;
  Layout lx, lc, ls;
  int64_t cs[kMaxDims] = {0}, ss[kMaxDims] = {0};
  bool ok = check_float(op, "x", x, st) && check_float(op, "cos", cos, st) && check_float(op, "sin", sin, st) &&
      check_float(op, "out", out, st) && layout_of(x, "x", lx, st) && layout_of(cos, "cos", lc, st) &&
      layout_of(sin, "sin", ls, st);
  if (ok && (lx.ndim == 0 || lx.sizes[lx.ndim - 1] % 2 != 0)) {
    ok = st.fail("%s: x %s must have an even last dimension", op, etfuse::core::ShapeStr(lx).c_str());
  }
  Layout half = lx;
  if (ok) half.sizes[lx.ndim - 1] /= 2;
  ok = ok && angle_strides(op, "cos", lc, half, cs, st) && angle_strides(op, "sin", ls, half, ss, st);
  Out o(out);
  ok = ok && o.resize(op, lx.ndim, lx.sizes, st);
  Input in(x, lx);
  if (ok && !is_contiguous(lx)) in.make_contiguous();
  ok = ok && o.open({&x, &cos, &sin}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  const int last = lx.ndim - 1;
  const int64_t n = half.sizes[last], rows = n ? half.numel() / n : 0;
  const int64_t cj = cs[last], sj = ss[last];
  const float* px = in.data<float>();
  const float* pc = cos.const_data_ptr<float>();
  const float* ps = sin.const_data_ptr<float>();
  float* po = o.data<float>();
  int64_t idx[kMaxDims] = {0};
  int64_t co = 0, so = 0;  // offsets of this row's cos and sin
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = px + r * 2 * n;
    float* y = po + r * 2 * n;
    for (int64_t j = 0; j < n; ++j) {
      const float re = a[2 * j], im = a[2 * j + 1], c = pc[co + j * cj], s = ps[so + j * sj];
      const float rc = re * c, is = im * s, rs = re * s, ic = im * c;
      y[2 * j] = rc - is;
      y[2 * j + 1] = rs + ic;
    }
    for (int d = last - 1; d >= 0; --d) {  // next row: advance the leading-dims counter
      co += cs[d];
      so += ss[d];
      if (++idx[d] < half.sizes[d]) break;
      co -= cs[d] * half.sizes[d];
      so -= ss[d] * half.sizes[d];
      idx[d] = 0;
    }
  }
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "rope.out", rope_out);
