// etfuse::addmm_relu.out: relu(self + mat1 @ mat2): the GEMM entry with the clamp [0, inf).
#include "adapter.h"
#include "core/gemm_entry.h"

namespace {

using namespace etfuse::adapter;
namespace core = etfuse::core;
namespace ge = etfuse::core::gemm_entry;

Tensor& addmm_relu_out(Context& ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2, Tensor& out) {
  constexpr const char* op = "etfuse::addmm_relu.out";
  Status st;
  Layout ls, l1, l2;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  core::gemm::Args g;
  Out o(out);
  const bool ok = check_float(op, "self", self, st) && check_float(op, "mat1", mat1, st) &&
      check_float(op, "mat2", mat2, st) && check_float(op, "out", out, st) && layout_of(self, "self", ls, st) &&
      layout_of(mat1, "mat1", l1, st) && layout_of(mat2, "mat2", l2, st) &&
      ge::addmm_out_shape(ls, l1, l2, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      o.open({&self, &mat1, &mat2}, false, true, st) &&
      ge::addmm_args(self.const_data_ptr<float>(), ls, mat1.const_data_ptr<float>(), l1, mat2.const_data_ptr<float>(),
                     l2, o.data<float>(), o.write_layout(), g, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  ge::run(g, ge::Clamp::relu(), Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "addmm_relu.out", addmm_relu_out);
