// etfuse::permute_copy.out: the permuted tensor, contiguous, any dtype of 1, 2, 4 or 8 bytes (core/copy.h).
#include "adapter.h"
#include "core/copy.h"

namespace {

using namespace etfuse::adapter;

Tensor& permute_copy_out(Context& ctx, const Tensor& self, IntList dims, Tensor& out) {
  constexpr const char* op = "etfuse::permute_copy.out";
  Status st;
  Layout l;
  int64_t sizes[etfuse::core::kMaxDims], strides[etfuse::core::kMaxDims];
  Out o(out);
  bool ok = check_cpu(op, "self", self, st) && layout_of(self, "self", l, st);
  if (ok && static_cast<int64_t>(dims.size()) != l.ndim) {
    ok = st.fail("%s: dims has %lld entries for a tensor of rank %d", op, (long long)dims.size(), l.ndim);
  }
  bool seen[etfuse::core::kMaxDims] = {false};
  for (int d = 0; ok && d < l.ndim; ++d) {
    const int64_t k = dims[d] < 0 ? dims[d] + l.ndim : dims[d];
    if (k < 0 || k >= l.ndim || seen[k]) {
      ok = st.fail("%s: dims is not a permutation of the tensor's %d dimensions", op, l.ndim);
      break;
    }
    seen[k] = true;
    sizes[d] = l.sizes[k];
    strides[d] = l.strides[k];
  }
  const size_t es = ok ? element_size(self) : 4;
  if (ok && es != 1 && es != 2 && es != 4 && es != 8) ok = st.fail("%s: elements of %d bytes", op, (int)es);
  if (ok && out.scalar_type() != self.scalar_type()) {
    ok = st.fail("%s: out has dtype %s, self %s", op, dtype_name(out.scalar_type()), dtype_name(self.scalar_type()));
  }
  ok = ok && o.resize(op, l.ndim, sizes, st) && o.open({&self}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  etfuse::core::copy::gather(etfuse::core::copy::plan(l.ndim, sizes, strides),
                             static_cast<const char*>(self.const_data_ptr()), static_cast<char*>(o.raw()), es,
                             Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "permute_copy.out", permute_copy_out);
