// The op layer of the linears over a quantized weight as linear_qw holds it (etfuse::linear_qw,
// etfuse::linear_dq: the same arguments): the arguments checked, out resized, the input, bias and
// residual read contiguously, the core's Args filled (core/linear_qw.h) and, after `run(args)`
// has written the sums, the activation (core/activation.h; a gated one halves out's features).
#pragma once

#include <vector>

#include "ops/clamp_args.h"
#include "core/linear_qw.h"

namespace etfuse {
namespace adapter {

namespace qw = etfuse::core::linear_qw;

// t's layout, if it is a CPU tensor of `want`.
inline bool typed_layout_of(const char* op, const char* name, const Tensor& t, ScalarType want, Layout& l,
                            Status& st) {
  if (!check_cpu(op, name, t, st) || !layout_of(t, name, l, st)) return false;
  if (t.scalar_type() == want) return true;
  return st.fail("%s: %s must be %s, got %s", op, name, dtype_name(want), dtype_name(t.scalar_type()));
}

inline bool contiguous_of(const char* op, const char* name, const Tensor& t, ScalarType want, Layout& l, Status& st) {
  if (!typed_layout_of(op, name, t, want, l, st)) return false;
  if (!is_contiguous(l)) return st.fail("%s: %s must be contiguous", op, name);
  return true;
}

// The Parallel for run(args): a few rows of A (decode) stream the whole weight once, bound by
// memory, and with Parallel's two chunks a thread the caller waited on the other thread's last
// chunk whenever the host slowed that core (7% of a 2-thread 8da4w 1B decode); 16 chunks a
// thread leave a sixteenth of a share to wait on. More rows (prefill) keep the two.
inline Parallel weight_stream_parallel(const qw::Args& a) {
  constexpr int64_t kStreamingRows = 4;
  return Parallel{a.M <= kStreamingRows ? 16 : 2};
}

template <class Run>
Tensor& quantized_weight_linear_out(const char* op, Context& ctx, const Tensor& input, const Tensor& weight,
                                    const Tensor& scales, const OptTensor& zero_points, int64_t bits,
                                    const OptTensor& bias, Str activation, const OptTensor& residual, Tensor& out,
                                    Run&& run) {
  Status st;
  etfuse::core::activation::Kind act;
  bool gated;
  Layout li, lw, ls, lz, lb, lr;
  bool ok = linear_activation_of(op, activation, act, gated, st) && check_float(op, "input", input, st) &&
      check_float(op, "out", out, st) && layout_of(input, "input", li, st);
  if (ok && bits != 8 && bits != 4) ok = st.fail("%s: bits must be 8 or 4, got %lld", op, (long long)bits);
  ok = ok && contiguous_of(op, "weight", weight, bits == 8 ? ScalarType::Char : ScalarType::Byte, lw, st) &&
      contiguous_of(op, "scales", scales, ScalarType::Float, ls, st);
  if (ok && li.ndim < 1) ok = st.fail("%s: input must have at least 1 dimension", op);
  if (ok && lw.ndim != 2) ok = st.fail("%s: weight must be 2-D, got %s", op, etfuse::core::ShapeStr(lw).c_str());
  const int64_t K = ok ? li.size(-1) : 0, N = ok ? lw.sizes[0] : 0;
  if (ok && lw.sizes[1] * (bits == 4 ? 2 : 1) != K) {
    ok = st.fail("%s: weight %s does not hold %lld input features at %lld bits", op,
                 etfuse::core::ShapeStr(lw).c_str(), (long long)K, (long long)bits);
  }
  const int64_t groups = ok && ls.ndim == 2 ? ls.sizes[1] : 1;
  if (ok && !((ls.ndim == 2 && ls.sizes[0] == N && groups > 0 && K % groups == 0) ||
              (ls.ndim == 1 && ls.sizes[0] == N))) {
    ok = st.fail("%s: scales %s must be [%lld, groups] with groups dividing %lld", op,
                 etfuse::core::ShapeStr(ls).c_str(), (long long)N, (long long)K);
  }
  if (ok && bits == 4 && (K / groups) % qw::kChunk != 0) {
    ok = st.fail("%s: 4-bit groups of %lld columns; the packing needs a multiple of %lld", op,
                 (long long)(K / groups), (long long)qw::kChunk);
  }
  if (ok && has(zero_points)) {
    ok = contiguous_of(op, "zero_points", *zero_points, ScalarType::Char, lz, st);
    if (ok && lz.numel() != N * groups) {
      ok = st.fail("%s: zero_points %s must have the scales' shape %s", op, etfuse::core::ShapeStr(lz).c_str(),
                   etfuse::core::ShapeStr(ls).c_str());
    }
  }
  if (ok && has(bias)) {
    ok = check_float(op, "bias", *bias, st) && layout_of(*bias, "bias", lb, st);
    if (ok && !(lb.ndim == 1 && lb.sizes[0] == N)) {
      ok = st.fail("%s: bias must be [%lld], got %s", op, (long long)N, etfuse::core::ShapeStr(lb).c_str());
    }
  }
  Out o(out);
  int64_t sizes[etfuse::core::kMaxDims];
  for (int d = 0; ok && d < li.ndim; ++d) sizes[d] = li.sizes[d];
  if (ok) sizes[li.ndim - 1] = N;
  Layout lsums;  // gated: the sums of all N features, combined into out [.., N / 2]
  std::vector<float> sums;
  ok = ok && (!gated || gated_sums(op, li.ndim, sizes, lsums, sums, st)) && o.resize(op, li.ndim, sizes, st);
  ok = ok && (!has(residual) || (check_float(op, "residual", *residual, st) &&
                                 layout_of(*residual, "residual", lr, st) &&
                                 same_shape(op, "residual", lr, gated ? lsums : o.layout(), st)));
  Input in(input, li);
  if (ok && !is_contiguous(li)) in.make_contiguous();
  Input b(has(bias) ? *bias : input, lb);
  if (ok && has(bias) && lb.strides[0] != 1 && N > 1) b.make_contiguous();
  Input res(has(residual) ? *residual : input, lr);
  if (ok && has(residual) && !is_contiguous(lr)) res.make_contiguous();
  ok = ok && o.open({&input, has(bias) ? &*bias : nullptr, has(residual) ? &*residual : nullptr}, false,
                    is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  qw::Args a;
  int64_t rows = 1;  // the input's leading dims
  for (int d = 0; ok && d + 1 < li.ndim; ++d) rows *= li.sizes[d];
  a.M = K && N ? rows : 0;
  a.N = N;
  a.K = K;
  a.A = in.data<float>();
  a.a_rs = K;
  a.W = static_cast<const uint8_t*>(weight.const_data_ptr());
  a.w_rs = lw.sizes[1];
  a.bits = static_cast<int>(bits);
  a.scales = scales.const_data_ptr<float>();
  a.groups = groups;
  a.zp = has(zero_points) ? static_cast<const int8_t*>(zero_points->const_data_ptr()) : nullptr;
  a.bias = has(bias) ? b.data<float>() : nullptr;
  a.C = gated ? sums.data() : o.data<float>();
  a.c_rs = N;
  a.residual = has(residual) ? res.data<float>() : nullptr;
  a.r_rs = N;
  if (K == 0) {  // an empty sum: the bias and the residual alone
    float* c = a.C;
    for (int64_t i = 0; i < rows * N; ++i) c[i] = (a.bias ? a.bias[i % N] : 0.0f) + (a.residual ? a.residual[i] : 0.0f);
  } else {
    run(a);
  }
  if (gated) {
    etfuse::core::activation::apply_gated(act, sums.data(), rows, N / 2, o.data<float>(), N / 2, 1, Parallel{});
  } else {
    etfuse::core::activation::apply(act, o.data<float>(), o.write_layout(), Parallel{});
  }
  return o.finish();
}

}  // namespace adapter
}  // namespace etfuse
