// etfuse::group_sums.out: int8 [N, K] -> int32 [N, K / group_size], each row's sum over its groups of
// group_size columns (linear_dq's weight_sums). Only the ExecutorchBackendConfig(passes=...) route
// runs it (once per call); etfuse.fuse and transform fold it into a constant.
#include "adapter.h"

namespace {

using namespace etfuse::adapter;

Tensor& group_sums_out(Context& ctx, const Tensor& weight, int64_t group_size, Tensor& out) {
  constexpr const char* op = "etfuse::group_sums.out";
  Status st;
  Layout lw;
  bool ok = check_cpu(op, "weight", weight, st) && layout_of(weight, "weight", lw, st);
  if (ok && weight.scalar_type() != ScalarType::Char) {
    ok = st.fail("%s: weight must be int8, got %s", op, dtype_name(weight.scalar_type()));
  }
  if (ok && (lw.ndim != 2 || group_size < 1 || lw.sizes[1] % group_size != 0)) {
    ok = st.fail("%s: weight must be [N, K] with K a multiple of group_size %lld, got %s", op, (long long)group_size,
                 etfuse::core::ShapeStr(lw).c_str());
  }
  if (ok && out.scalar_type() != ScalarType::Int) {
    ok = st.fail("%s: out must be int32, got %s", op, dtype_name(out.scalar_type()));
  }
  Input w(weight, lw);
  if (ok && !is_contiguous(lw)) w.make_contiguous();
  Out o(out);
  const int64_t n = ok ? lw.sizes[0] : 0, k = ok ? lw.sizes[1] : 0, groups = ok ? k / group_size : 0;
  if (ok) {
    const int64_t sizes[2] = {n, groups};
    ok = o.resize(op, 2, sizes, st) && o.open({&weight}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  const int8_t* q = w.data<int8_t>();
  int32_t* s = o.data<int32_t>();
  for (int64_t i = 0; i < n * groups; ++i) {
    int32_t sum = 0;
    for (int64_t c = 0; c < group_size; ++c) sum += q[i * group_size + c];
    s[i] = sum;
  }
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "group_sums.out", group_sums_out);
