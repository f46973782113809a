// etfuse::max_pool2d.out, etfuse::avg_pool2d.out, etfuse::mean_hw.out: pooling over the last two
// dims of a float32 (N, C, H, W) or (C, H, W) tensor (core/pool2d.h).
#include "adapter.h"
#include "core/pool2d.h"

namespace {

using namespace etfuse::adapter;
namespace pool = etfuse::core::pool2d;

// The input as contiguous planes (a strided input is copied once per call), the output
// resized and opened; then the core.
template <bool kMax>
Tensor& pool_into(Context& ctx, const char* op, const Tensor& input, pool::Params& p, IntList kernel_size,
                  IntList stride, IntList padding, IntList dilation, Tensor& out) {
  Status st;
  Layout li;
  int ndim = 0;
  int64_t sizes[etfuse::core::kMaxDims];
  Out o(out);
  bool ok = check_float(op, "input", input, st) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) &&
      pool::pair(op, "kernel_size", kernel_size.data(), kernel_size.size(), nullptr, p.kernel, st) &&
      pool::pair(op, "stride", stride.data(), stride.size(), p.kernel, p.stride, st) &&
      pool::pair(op, "padding", padding.data(), padding.size(), nullptr, p.padding, st) &&
      pool::pair(op, "dilation", dilation.data(), dilation.size(), nullptr, p.dilation, st) &&
      pool::out_shape(op, li, p, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      o.open({&input}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  Input in(input, li);
  if (!is_contiguous(li)) in.make_contiguous();
  const int64_t h = li.size(-2), w = li.size(-1), oh = sizes[ndim - 2], ow = sizes[ndim - 1];
  const int64_t planes = oh * ow ? o.layout().numel() / (oh * ow) : 0;
  pool::run<kMax>(in.data<float>(), o.data<float>(), planes, h, w, oh, ow, p, Parallel{});
  return o.finish();
}

Tensor& max_pool2d_out(Context& ctx, const Tensor& input, IntList kernel_size, IntList stride, IntList padding,
                       IntList dilation, bool ceil_mode, Tensor& out) {
  pool::Params p;
  p.ceil_mode = ceil_mode;
  return pool_into<true>(ctx, "etfuse::max_pool2d.out", input, p, kernel_size, stride, padding, dilation, out);
}

Tensor& avg_pool2d_out(Context& ctx, const Tensor& input, IntList kernel_size, IntList stride, IntList padding,
                       bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override, Tensor& out) {
  constexpr const char* op = "etfuse::avg_pool2d.out";
  pool::Params p;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  if (divisor_override.has_value()) {
    Status st;
    const bool ok = *divisor_override != 0 || st.fail("%s: divisor_override must be non-zero", op);
    ETFUSE_CHECK(ctx, ok, st, out);
    p.divisor = *divisor_override;
  }
  const int64_t one[2] = {1, 1};
  return pool_into<false>(ctx, op, input, p, kernel_size, stride, padding, IntList(one, 2), out);
}

Tensor& mean_hw_out(Context& ctx, const Tensor& input, bool keepdim, Tensor& out) {
  constexpr const char* op = "etfuse::mean_hw.out";
  Status st;
  Layout li;
  int ndim = 0;
  int64_t sizes[etfuse::core::kMaxDims];
  Out o(out);
  const bool ok = check_float(op, "input", input, st) && check_float(op, "out", out, st) &&
      layout_of(input, "input", li, st) && pool::mean_shape(op, li, keepdim, ndim, sizes, st) &&
      o.resize(op, ndim, sizes, st) && o.open({&input}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  Input in(input, li);
  if (!is_contiguous(li)) in.make_contiguous();
  const int64_t n = li.size(-2) * li.size(-1);
  pool::mean_planes(in.data<float>(), o.data<float>(), o.layout().numel(), n, Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "max_pool2d.out", max_pool2d_out);
ETFUSE_REGISTER(etfuse, "avg_pool2d.out", avg_pool2d_out);
ETFUSE_REGISTER(etfuse, "mean_hw.out", mean_hw_out);
