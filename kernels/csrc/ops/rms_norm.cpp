// etfuse::rms_norm.out: x * rsqrt(mean(x^2, -1) + eps) * weight over the last dimension (core/norm.h).
#include "adapter.h"
#include "core/norm.h"

namespace {

using namespace etfuse::adapter;

Tensor& rms_norm_out(Context& ctx, const Tensor& input, const OptTensor& weight, double eps, Tensor& out) {
  constexpr const char* op = "etfuse::rms_norm.out";
  Status st;
  Layout li, lw;
  Out o(out);
  bool ok = check_float(op, "input", input, st) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) &&
      (!has(weight) || (check_float(op, "weight", *weight, st) && layout_of(*weight, "weight", lw, st)));
  if (ok && li.ndim == 0) ok = st.fail("%s: input must have at least one dimension", op);
  const int64_t n = ok ? li.sizes[li.ndim - 1] : 0;
  if (ok && has(weight) && (lw.ndim != 1 || lw.sizes[0] != n)) {
    ok = st.fail("%s: weight %s must be [%lld], the input's last dimension", op, etfuse::core::ShapeStr(lw).c_str(),
                 (long long)n);
  }
  ok = ok && o.resize(op, li.ndim, li.sizes, st);
  Input in(input, li);
  if (ok && !is_contiguous(li)) in.make_contiguous();
  Input w(has(weight) ? *weight : input, lw);
  if (ok && has(weight) && lw.strides[0] != 1 && n > 1) w.make_contiguous();
  ok = ok && o.open({&input, has(weight) ? &*weight : nullptr}, true, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  etfuse::core::norm::Args a;
  a.n = n;
  a.rows = n ? li.numel() / n : 0;
  a.x = in.data<float>();
  a.weight = has(weight) ? w.data<float>() : nullptr;
  a.eps = static_cast<float>(eps);
  a.out = o.data<float>();
  etfuse::core::norm::run(a, Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "rms_norm.out", rms_norm_out);
