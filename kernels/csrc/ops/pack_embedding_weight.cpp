// quant_fusion::_pack_embedding_weight.out: an int8 [N, D] table packed for embedding_4bit /
// embedding_2bit (core/embedding.h), bitwidth 8: a copy. Only the ExecutorchBackendConfig(passes=...)
// route runs it (once per call); etfuse.fuse and transform fold it into a constant.
#include <cstring>

#include "adapter.h"
#include "core/embedding.h"

namespace {

using namespace etfuse::adapter;

Tensor& pack_embedding_weight_out(Context& ctx, const Tensor& weight, int64_t bits, Tensor& out) {
  constexpr const char* op = "quant_fusion::_pack_embedding_weight.out";
  Status st;
  bool ok = check_cpu(op, "weight", weight, st);
  if (ok && weight.scalar_type() != ScalarType::Char && weight.scalar_type() != ScalarType::Byte) {
    ok = st.fail("%s: weight must be int8 or uint8, got %s", op, dtype_name(weight.scalar_type()));
  }
  if (ok && weight.dim() != 2) ok = st.fail("%s: weight must be [N, D], got rank %lld", op, (long long)weight.dim());
  if (ok && bits != 2 && bits != 4 && bits != 8) ok = st.fail("%s: unsupported bitwidth %lld", op, (long long)bits);
  const int64_t per_byte = ok ? 8 / bits : 1;
  if (ok && weight.size(1) % per_byte != 0) {
    ok = st.fail("%s: D = %lld is not a multiple of %lld", op, (long long)weight.size(1), (long long)per_byte);
  }
  const ScalarType want = bits == 8 ? weight.scalar_type() : ScalarType::Byte;
  if (ok && out.scalar_type() != want) {
    ok = st.fail("%s: out must be %s, got %s", op, dtype_name(want), dtype_name(out.scalar_type()));
  }
  Layout lw;
  ok = ok && layout_of(weight, "weight", lw, st);
  Input w(weight, lw);
  if (ok && !is_contiguous(lw)) w.make_contiguous();
  Out o(out);
  if (ok) {
    const int64_t sizes[2] = {weight.size(0), weight.size(1) / per_byte};
    ok = o.resize(op, 2, sizes, st) && o.open({&weight}, false, is_contiguous(o.layout()), st);
  }
  ETFUSE_CHECK(ctx, ok, st, out);
  const int64_t n = weight.size(0), d = weight.size(1);
  if (bits == 8) {
    if (n * d) std::memcpy(o.raw(), w.data<uint8_t>(), static_cast<size_t>(n * d));
  } else {
    etfuse::core::embedding::pack(w.data<uint8_t>(), n, d, static_cast<int>(bits), o.data<uint8_t>());
  }
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(quant_fusion, "_pack_embedding_weight.out", pack_embedding_weight_out);
