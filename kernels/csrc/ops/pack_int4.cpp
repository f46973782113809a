// etfuse::pack_int4.out: int8 [N, K] values in [-8, 7] packed two per byte for linear_qw
// (core/linear_qw.h). Only the ExecutorchBackendConfig(passes=...) route runs it (once per call);
// etfuse.fuse and transform fold it into a constant.
#include "adapter.h"
#include "core/linear_qw.h"

namespace {

using namespace etfuse::adapter;
namespace qw = etfuse::core::linear_qw;

Tensor& pack_int4_out(Context& ctx, const Tensor& weight, Tensor& out) {
  constexpr const char* op = "etfuse::pack_int4.out";
  Status st;
  Layout lw;
  bool ok = check_cpu(op, "weight", weight, st) && layout_of(weight, "weight", lw, st);
  if (ok && weight.scalar_type() != ScalarType::Char) {
    ok = st.fail("%s: weight must be int8, got %s", op, dtype_name(weight.scalar_type()));
  }
  if (ok && (lw.ndim != 2 || lw.sizes[1] % qw::kChunk != 0)) {
    ok = st.fail("%s: weight must be [N, K] with K a multiple of %lld, got %s", op, (long long)qw::kChunk,
                 etfuse::core::ShapeStr(lw).c_str());
  }
  if (ok && out.scalar_type() != ScalarType::Byte) {
    ok = st.fail("%s: out must be uint8, got %s", op, dtype_name(out.scalar_type()));
  }
  Input w(weight, lw);
  if (ok && !is_contiguous(lw)) w.make_contiguous();
  Out o(out);
  if (ok) {
    const int64_t sizes[2] = {lw.sizes[0], lw.sizes[1] / 2};
    ok = o.resize(op, 2, sizes, st) && o.open({&weight}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  qw::pack4(w.data<int8_t>(), lw.sizes[0], lw.sizes[1], o.data<uint8_t>());
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "pack_int4.out", pack_int4_out);
