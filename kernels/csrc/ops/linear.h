// The linear ops' shared body (linear_relu.cpp, linear_act.cpp): one call of the GEMM entry
// (core/gemm_entry.h) with the op's clamp. Included by op files only, inside their namespace.
#pragma once

#include "adapter.h"
#include "core/gemm_entry.h"

namespace etfuse {
namespace adapter {

inline Tensor& linear_into(Context& ctx, const char* op, const Tensor& input, const Tensor& weight,
                           const OptTensor& bias, const core::gemm_entry::Clamp& clamp, bool clamp_ok, Tensor& out) {
  namespace ge = core::gemm_entry;
  Status st;
  Layout li, lw, lb;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  int64_t m, rs, cs;
  const bool has_bias = has(bias);
  Out o(out);
  bool ok = clamp_ok && check_float(op, "input", input, st) && check_float(op, "weight", weight, st) &&
      (!has_bias || check_float(op, "bias", *bias, st)) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) && layout_of(weight, "weight", lw, st) &&
      (!has_bias || layout_of(*bias, "bias", lb, st)) &&
      ge::linear_out_shape(li, lw, has_bias ? &lb : nullptr, ndim, sizes, st) && o.resize(op, ndim, sizes, st);
  Input in(input, li);
  if (ok && !ge::as_matrix(li, m, rs, cs)) in.make_contiguous();  // leading dims that do not merge
  core::gemm::Args g;
  ok = ok && o.open({&input, &weight, has_bias ? &*bias : nullptr}, false, ge::as_matrix(o.layout(), m, rs, cs), st) &&
      ge::linear_args(in.data<float>(), in.layout(), weight.const_data_ptr<float>(), lw,
                      has_bias ? bias->const_data_ptr<float>() : nullptr, has_bias ? &lb : nullptr, o.data<float>(),
                      o.write_layout(), g, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  ge::run(g, clamp, Parallel{});
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
