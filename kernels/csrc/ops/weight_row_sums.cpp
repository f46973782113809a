// etfuse::weight_row_sums.out: a quantized weight's dequantized row sums, float32 [N]:
// sum_k (q[n, k] - zp[n, g(k)]) * scales[n, g(k)] over an int8 [N, K] weight with scales (and int8
// zero points) per group of K / groups columns ([N, groups], or [N] per channel): linear_dq's
// weight_row_sums (core/linear_dq.h). Each group's integer sum is exact, the scaled sum taken in
// double and rounded once. Only the ExecutorchBackendConfig(passes=...) route runs it (once per
// call); etfuse.fuse and transform fold it into a constant.
#include "ops/quantized_weight_linear.h"

namespace {

using namespace etfuse::adapter;

Tensor& weight_row_sums_out(Context& ctx, const Tensor& weight, const Tensor& scales, const OptTensor& zero_points,
                            Tensor& out) {
  constexpr const char* op = "etfuse::weight_row_sums.out";
  Status st;
  Layout lw, ls, lz;
  bool ok = typed_layout_of(op, "weight", weight, ScalarType::Char, lw, st) &&
      typed_layout_of(op, "scales", scales, ScalarType::Float, ls, st);
  const int64_t n = ok && lw.ndim == 2 ? lw.sizes[0] : 0, k = ok && lw.ndim == 2 ? lw.sizes[1] : 0;
  const int64_t groups = n > 0 ? ls.numel() / n : 0;
  if (ok && (lw.ndim != 2 || n == 0 || ls.ndim < 1 || ls.sizes[0] != n || groups < 1 || groups * n != ls.numel() ||
             k % groups != 0)) {
    ok = st.fail("%s: weight %s and scales %s must be [N, K] and [N, groups] (or [N]) with groups dividing K", op,
                 etfuse::core::ShapeStr(lw).c_str(), etfuse::core::ShapeStr(ls).c_str());
  }
  const bool zp = has(zero_points);
  if (ok && zp) {
    ok = typed_layout_of(op, "zero_points", *zero_points, ScalarType::Char, lz, st);
    if (ok && lz.numel() != ls.numel()) {
      ok = st.fail("%s: zero_points %s must have the scales' shape %s", op, etfuse::core::ShapeStr(lz).c_str(),
                   etfuse::core::ShapeStr(ls).c_str());
    }
  }
  ok = ok && check_float(op, "out", out, st);
  Out o(out);
  if (ok) {
    const int64_t sizes[1] = {n};
    ok = o.resize(op, 1, sizes, st) && o.open({&weight, &scales}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  Input q(weight, lw), s(scales, ls), z(zp ? *zero_points : weight, lz);
  if (!is_contiguous(lw)) q.make_contiguous();
  if (!is_contiguous(ls)) s.make_contiguous();
  if (zp && !is_contiguous(lz)) z.make_contiguous();
  const int8_t* qd = q.data<int8_t>();
  const float* sd = s.data<float>();
  const int8_t* zd = zp ? z.data<int8_t>() : nullptr;
  const int64_t G = k / groups;
  float* r = o.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int64_t g = 0; g < groups; ++g) {
      int64_t d = 0;
      for (int64_t c = 0; c < G; ++c) d += qd[(i * groups + g) * G + c];
      if (zd) d -= G * zd[i * groups + g];
      sum += static_cast<double>(sd[i * groups + g]) * static_cast<double>(d);
    }
    r[i] = static_cast<float>(sum);
  }
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "weight_row_sums.out", weight_row_sums_out);
