// The linear ops' shared body (linear_relu.cpp, linear_act.cpp, linear_bn_act.cpp): one call of the GEMM entry
// (core/gemm_entry.h) with the op's clamp, then its activation (core/activation.h). Included by op files only, inside their namespace.
#pragma once

#include "adapter.h"
#include "ops/clamp_args.h"
#include "core/activation.h"
#include "core/gemm_entry.h"

namespace etfuse {
namespace adapter {

// `bias`/`lb`: the per-output-feature values added last (null: none); `bias_tensor`: the tensor
// they live in when they are an input (null when the op computed them); `scale`: null or one
// float per output feature, applied before the bias (linear_bn_act). `packed_n` >= 0: `weight` is
// packed at fuse time for that many output features (linear_packed_act, gemm_entry::packed_weight).
// `residual` (null: none), of out's shape, is added before the clamp by the GEMM's epilogue
// (gemm::Args::residual), which reads it where it writes out: the add costs no pass of its own.
// `gated`: `act` is a gated activation's (swiglu: silu of the first half of the features times
// the second); out has half the weight's features, and the residual the GEMM's (all of them).
inline Tensor& linear_into(Context& ctx, const char* op, const Tensor& input, const Tensor& weight, const float* bias,
                           const Layout* lb, const Tensor* bias_tensor, const float* scale,
                           const core::gemm_entry::Clamp& clamp, core::activation::Kind act, bool ok, Status& st,
                           Tensor& out, int64_t packed_n = -1, const Tensor* residual = nullptr,
                           bool gated = false) {
  namespace ge = core::gemm_entry;
  Layout li, lw, lpacked;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  int64_t m, rs, cs;
  Out o(out);
  const bool packed = packed_n >= 0;
  ok = ok && check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      check_float(op, "out", out, st) && layout_of(input, "input", li, st) &&
      (packed ? layout_of(weight, "packed_weight", lpacked, st) && ge::packed_weight(lpacked, packed_n, lw, st)
              : layout_of(weight, "weight", lw, st)) &&
      ge::linear_out_shape(li, lw, lb, ndim, sizes, st);
  Layout lgemm;  // gated: the GEMM writes all 2H features here, combined into out [.., H]
  std::vector<float> gemm_scratch;
  ok = ok && (!gated || gated_sums(op, ndim, sizes, lgemm, gemm_scratch, st)) && o.resize(op, ndim, sizes, st);
  Layout lr;
  ok = ok && (!residual || (check_float(op, "residual", *residual, st) && layout_of(*residual, "residual", lr, st) &&
                            same_shape(op, "residual", lr, gated ? lgemm : o.layout(), st)));
  Input in(input, li), res(residual ? *residual : input, lr);
  if (ok && !ge::as_matrix(li, m, rs, cs)) in.make_contiguous();  // leading dims that do not merge
  int64_t r_rows, r_rs = 0, r_cs = 0;  // the residual as out's [M, N] matrix
  if (ok && residual && !ge::as_matrix(lr, r_rows, r_rs, r_cs)) {
    res.make_contiguous();
    ge::as_matrix(res.layout(), r_rows, r_rs, r_cs);
  }
  core::gemm::Args g;
  ok = ok && o.open({&input, &weight, bias_tensor, residual}, false, ge::as_matrix(o.layout(), m, rs, cs), st) &&
      ge::linear_args(in.data<float>(), in.layout(), weight.const_data_ptr<float>(), lw, bias, lb,
                      gated ? gemm_scratch.data() : o.data<float>(), gated ? lgemm : o.write_layout(), g, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  if (packed) {
    g.packed_b = g.B;
    g.B = nullptr;
  }
  g.scale = scale;  // one per output column
  g.scale_rs = 0;
  g.scale_cs = scale ? 1 : 0;
  if (residual) {
    g.residual = res.data<float>();
    g.residual_rs = r_rs;
    g.residual_cs = r_cs;
  }
  ge::run(g, clamp, Parallel{});
  if (gated) {
    int64_t rows, out_rs, out_cs;
    ge::as_matrix(o.write_layout(), rows, out_rs, out_cs);
    core::activation::apply_gated(act, gemm_scratch.data(), rows, g.N / 2, o.data<float>(), out_rs, out_cs, Parallel{});
  } else {
    core::activation::apply(act, o.data<float>(), o.write_layout(), Parallel{});
  }
  return o.finish();
}

// The linear ops whose bias is an optional input tensor.
inline Tensor& linear_into(Context& ctx, const char* op, const Tensor& input, const Tensor& weight,
                           const OptTensor& bias, const core::gemm_entry::Clamp& clamp, core::activation::Kind act,
                           bool clamp_ok, Tensor& out, int64_t packed_n = -1, const Tensor* residual = nullptr,
                           bool gated = false) {
  Status st;
  Layout lb;
  const bool has_bias = has(bias);
  const bool ok = clamp_ok && (!has_bias || (check_float(op, "bias", *bias, st) && layout_of(*bias, "bias", lb, st)));
  return linear_into(ctx, op, input, weight, ok && has_bias ? bias->const_data_ptr<float>() : nullptr,
                     has_bias ? &lb : nullptr, has_bias ? &*bias : nullptr, nullptr, clamp, act, ok, st, out,
                     packed_n, residual, gated);
}

}  // namespace adapter
}  // namespace etfuse
