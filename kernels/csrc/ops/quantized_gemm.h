// etfuse::quantized_conv2d / quantized_linear (backend_ops/quantized_gemm_ops.py): int8/uint8
// activations, an int8 weight with per-output-channel scale and zero point, a float32 bias.
//
// The products of 8-bit integers are summed exactly on the float32 GEMM and conv micro-kernels:
// the operands are the integers (x - x_zp) and (w - w_zp[c]) as floats, so every product is exact
// and every partial sum is an integer, exact below 2^24. The epilogue then requantizes:
//   y = acc * float32(input_scale * weight_scale[c]); y = y + bias[c]
//   out = clamp(rint(y * float(1 / output_scale)) + output_zp, output_min, output_max)
// one float32 operation at a time, never contracted into an FMA (compiled for AVX2 without FMA,
// or with contraction off where the baseline has FMA, like core/quantized.h), so it is bit-exact
// with the op's pattern. The per-ISA loops are core/int8_gemm.h's choosers'; the int8 kernels
// (core/int8_pointwise.h: x86 VNNI, aarch64 sdot / smlal; core/int8_depthwise.h: x86 AVX-512, aarch64 NEON)
// say whether they run here.
#pragma once

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "adapter.h"
#include "core/conv2d.h"
#include "core/gemm_entry.h"
#include "core/int8_depthwise.h"
#include "core/int8_gemm.h"
#include "core/int8_pointwise.h"
#include "ops/conv2d.h"
#include "ops/quantized_args.h"

namespace etfuse {
namespace adapter {
namespace quantized_gemm {

// A float buffer of the calling thread, kept between calls and grown as needed: a fresh
// allocation of a feature map's size is an mmap whose pages fault in (zeroed) on every call.
// One slot per use in a call (a kernel runs to its end before the thread calls another).
enum class Slot { kInput = 0, kWeight = 1, kAcc = 2 };

class Floats {
 public:
  explicit Floats(Slot slot) : slot_(static_cast<int>(slot)) {}
  void resize(int64_t n) {
    Buffer& b = pool()[slot_];
    if (b.size < n) {
      b.data.reset(new float[static_cast<size_t>(n)]);
      b.size = n;
    }
    p_ = b.data.get();
  }
  float* data() { return p_; }
  const float* data() const { return p_; }

 private:
  struct Buffer {
    std::unique_ptr<float[]> data;
    int64_t size = 0;
  };
  static Buffer* pool() {
    thread_local Buffer buffers[3];
    return buffers;
  }
  int slot_;
  float* p_ = nullptr;
};

// The per-call constants of the epilogue, and the operands as exact float integers.
struct Operands {
  qc::QType type = qc::QType::kInt8;
  qc::QParams in;             // input_scale / zero point
  qc::QParams out;            // output_scale / zero point, [output_min, output_max]
  std::vector<float> scale;   // float(input_scale) * weight_scale[c]
  std::vector<float> bias;    // empty: none
  std::vector<float> w_zp;    // empty: none (all 0)
  Floats x{Slot::kInput};     // float(x) - x_zp, contiguous
  Floats w{Slot::kWeight};    // float(w) - w_zp[c], contiguous [Cout, ...]
  core::int8_epilogue::Requant requant() const {
    core::int8_epilogue::Requant r;
    r.scale = scale.data();
    r.bias = bias.empty() ? nullptr : bias.data();
    r.inv = out.inv_scale;
    r.zp = out.zero_point;
    r.lo = out.qmin;
    r.hi = out.qmax;
    return r;
  }
  bool weight_symmetric() const {
    return std::all_of(w_zp.begin(), w_zp.end(), [](float z) { return z == 0.0f; });
  }
};

template <class T>
inline void integers(const T* q, int64_t n, float zp, float* out) {
  core::int8_gemm::integers(q, n, zp, out);
}

// Checks the arguments shared by the ops and fills `ops`' epilogue constants and zero points.
// `packed`: the weight is int8 panels (pack_gemm_weight) and `lw` is already the logical
// weight's layout [Cout, ...]; its zero points are 0 (the packed ops take none).
inline bool read_operands(const char* op, const Tensor& input, double input_scale, int64_t input_zero_point,
                          const Tensor& weight, const Tensor& weight_scale, const OptTensor& weight_zero_point,
                          const OptTensor& bias, double output_scale, int64_t output_zero_point, int64_t output_min,
                          int64_t output_max, const Tensor& out, Layout& li, Layout& lw, Operands& ops, Status& st,
                          bool packed = false) {
  if (!(check_cpu(op, "input", input, st) && check_cpu(op, "weight", weight, st) &&
        qtype_of(op, "input", input.scalar_type(), ops.type, st))) {
    return false;
  }
  if (out.scalar_type() != input.scalar_type()) {
    return st.fail("%s: out has dtype %s, the input %s (the op writes the input's dtype)", op,
                   dtype_name(out.scalar_type()), dtype_name(input.scalar_type()));
  }
  if (weight.scalar_type() != ScalarType::Char) {
    return st.fail("%s: weight must be int8, got %s", op, dtype_name(weight.scalar_type()));
  }
  if (!(qc::make_qparams(op, "input", input_scale, input_zero_point, qc::qtype_min(ops.type),
                         qc::qtype_max(ops.type), ops.type, ops.in, st) &&
        // the zero point need not lie in [output_min, output_max]: that range is the activation's
        qc::make_qparams(op, "output", output_scale, output_zero_point, qc::qtype_min(ops.type),
                         qc::qtype_max(ops.type), ops.type, ops.out, st) &&
        layout_of(input, "input", li, st) && (packed || layout_of(weight, "weight", lw, st)))) {
    return false;
  }
  if (output_min > output_max || output_min < qc::qtype_min(ops.type) || output_max > qc::qtype_max(ops.type)) {
    return st.fail("%s: output range [%lld, %lld] is empty or not inside %s's", op, (long long)output_min,
                   (long long)output_max, qc::qtype_name(ops.type));
  }
  ops.out.qmin = static_cast<float>(output_min);
  ops.out.qmax = static_cast<float>(output_max);
  const int64_t cout = lw.ndim ? lw.sizes[0] : 0;
  std::vector<float> wscale;
  if (!row_values(op, "weight_scale", weight_scale, cout, wscale, st)) return false;
  ops.w_zp.clear();
  if (has(weight_zero_point) && !row_values(op, "weight_zero_point", *weight_zero_point, cout, ops.w_zp, st)) {
    return false;
  }
  if (has(bias)) {
    if (bias->scalar_type() != ScalarType::Float) {
      return st.fail("%s: bias must be float32, got %s", op, dtype_name(bias->scalar_type()));
    }
    if (!row_values(op, "bias", *bias, cout, ops.bias, st)) return false;
  }
  ops.scale.resize(static_cast<size_t>(cout));
  for (int64_t c = 0; c < cout; ++c) ops.scale[c] = static_cast<float>(input_scale) * wscale[c];
  return true;
}

// The operands as exact float integers for the float32 cores: x (and w unless packed), both
// contiguous afterwards (li, lw).
inline void read_as_floats(const Tensor& input, const Tensor& weight, Layout& li, Layout& lw, Operands& ops,
                           bool packed) {
  Input x(input);
  x.read(li, !is_contiguous(li));
  ops.x.resize(li.numel());
  with_qtype(ops.type, [&](auto tag) {
    const auto* q = x.data<decltype(tag)>();
    qc::for_quantized(li.numel(), Parallel{},  // parallel chunks on a large map (96 x 48 x 48: 221K values)
                      [&](int64_t b, int64_t e) { integers(q + b, e - b, ops.in.zero_point, ops.x.data() + b); });
  });
  li = contiguous_layout(li);
  if (packed) return;
  Input w(weight);
  w.read(lw, !is_contiguous(lw));
  ops.w.resize(lw.numel());
  const int64_t cout = lw.sizes[0], per_channel = cout ? lw.numel() / cout : 0;
  if (ops.weight_symmetric()) {  // one pass (a depthwise weight is 9 values a channel)
    integers(w.data<int8_t>(), lw.numel(), 0.0f, ops.w.data());
  } else {
    for (int64_t c = 0; c < cout; ++c) {
      integers(w.data<int8_t>() + c * per_channel, per_channel, ops.w_zp[c], ops.w.data() + c * per_channel);
    }
  }
  lw = contiguous_layout(lw);
}

// ---- the epilogue: acc -> the quantized output ------------------------------------------------

// acc [outer, channels, inner] -> q (contiguous, same shape). Linear: inner 1, channels = N.
template <class T>
inline void requantize(const float* acc, int64_t outer, int64_t channels, int64_t inner, const Operands& ops, T* q) {
  const core::int8_epilogue::Requant r = ops.requant();
  const bool per = inner == 1;  // linear: a row holds one value per channel
  const auto f = per ? core::int8_gemm::requant_rows<T, true>() : core::int8_gemm::requant_rows<T, false>();
  const int64_t rows = per ? outer : outer * channels, width = per ? channels : inner;
  Parallel{}(int64_t(0), rows, std::max<int64_t>(1, qc::kQuantGrain / std::max<int64_t>(1, width)),
             [&](int64_t r0, int64_t r1) { f(acc + r0 * width, r1 - r0, width, r0, channels, r, q + r0 * width); });
}


// ---- a few rows on int8 panels: a GEMV that reads the weight once ----------------------------
// The GEMM's tiles would convert every K slice of every panel to floats in a buffer and then run
// MR-row tiles mostly empty (MobileNetV2's classifier: 1 x 1280 x 1000, 165 us). Here each
// panel's K x 16 values are converted in registers and multiplied into all rows' 16 sums.
constexpr int64_t kGemvMaxRows = 4;

// acc[M, N] = x[M, K] (rows x_rs apart) @ the int8 panels, M <= kGemvMaxRows.
inline void panels_rows(const float* x, int64_t M, int64_t x_rs, int64_t K, const int8_t* w, int64_t N, float* acc) {
  const int64_t panels = core::gemm::packed_panels(N);
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 17) / std::max<int64_t>(1, K * core::int8_gemm::kPanel));
  Parallel{}(int64_t(0), panels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t m = 0; m < M;) {
      const int64_t r = std::min<int64_t>(M - m, 2);
      (r == 2 ? core::int8_gemm::panels_rows<2>() : core::int8_gemm::panels_rows<1>())(x + m * x_rs, x_rs, K, w, p0,
                                                                                     p1, acc + m * N, N);
      m += r;
    }
  });
}

// ---- a conv on int8 kernels: int8 in, int32 sums, int8 out (core/int8_pointwise.h) ------------

inline core::int8_epilogue::Geometry geometry(const Layout& li, const Layout& lw, const Layout& lo,
                                              const core::conv2d::Params& p) {
  core::int8_epilogue::Geometry g;
  g.N = li.sizes[0];
  g.C = li.sizes[1];
  g.H = li.sizes[2];
  g.W = li.sizes[3];
  g.KH = lw.sizes[2];
  g.KW = lw.sizes[3];
  g.OH = lo.sizes[2];
  g.OW = lo.sizes[3];
  for (int d = 0; d < 2; ++d) {
    g.stride[d] = p.stride[d];
    g.padding[d] = p.padding[d];
    g.dilation[d] = p.dilation[d];
  }
  return g;
}

// Groups 1 and symmetric weights: 1x1 convs read the input in place, the others its im2col.
inline bool int8_conv(const core::conv2d::Params& p, const Operands& ops) {
  return core::int8_pointwise::available() && p.groups == 1 && ops.weight_symmetric();
}

// Reads the input and weight as they are (through a contiguous copy only where they are not);
// the kernel lays the weight (rows, or the packed ops' panels) out as it reads it.
inline void run_int8_conv(const Tensor& input, const Tensor& weight, bool packed, const Layout& li, const Layout& lw,
                          const Layout& lo, const core::conv2d::Params& p, const Operands& ops, Out& o) {
  namespace pw = core::int8_pointwise;
  Input x(input), w(weight);
  x.read(li, !is_contiguous(li));
  if (!packed) w.read(lw, !is_contiguous(lw));
  const int64_t C = lw.sizes[0], K = lw.sizes[1] * lw.sizes[2] * lw.sizes[3];
  pw::Problem pb;
  pb.panels = packed;
  pb.x = x.data<uint8_t>();
  pb.x_signed = ops.type == qc::QType::kInt8;
  pb.x_zero_point = static_cast<int32_t>(ops.in.zero_point);  // an integer in [-128, 255]: exact
  pb.w = packed ? weight.const_data_ptr<int8_t>() : w.data<int8_t>();
  pb.N = li.sizes[0];
  pb.K = K;
  pb.C = C;
  pb.P = lo.sizes[2] * lo.sizes[3];
  pb.requant = ops.requant();
  pb.out = static_cast<uint8_t*>(o.raw());
  const bool pointwise = K == li.sizes[1] && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 0 &&
      p.padding[1] == 0;
  if (pointwise) {
    pw::conv(pb, Parallel{});
    return;
  }
  // one image at a time over its im2col (K x OH * OW bytes)
  const core::int8_epilogue::Geometry g = geometry(li, lw, lo, p);
  thread_local std::vector<uint8_t> cols, border;
  cols.resize(std::max(cols.size(), static_cast<size_t>(K * pb.P)));
  // + 64: the stride-2 gather's last 16-bit read ends one byte past its row
  border.resize(std::max(border.size(), static_cast<size_t>(g.C * (g.H + 2 * g.padding[0]) * (g.W + 2 * g.padding[1]) + 64)));
  const uint8_t pad = static_cast<uint8_t>(static_cast<int32_t>(ops.in.zero_point));  // the zero point's byte
  const uint8_t* images = pb.x;
  uint8_t* outs = pb.out;
  pb.N = 1;
  for (int64_t n = 0; n < li.sizes[0]; ++n) {
    pw::im2col(g, images + n * g.C * g.H * g.W, pad, border.data(), cols.data());
    pb.x = cols.data();
    pb.out = outs + n * C * pb.P;
    pw::conv(pb, Parallel{});
  }
}

// ---- a depthwise conv on AVX-512 (exact float sums) or NEON (int32 sums): int8 in, int8 out (core/int8_depthwise.h)

inline bool int8_depthwise(const Layout& li, const Layout& lw, const Layout& lo, const core::conv2d::Params& p) {
  return core::int8_depthwise::available() && p.groups > 1 && p.groups == li.sizes[1] && lw.sizes[1] == 1 &&
      lo.sizes[1] == p.groups && p.stride[0] == p.stride[1] && (p.stride[0] == 1 || p.stride[0] == 2) &&
      p.dilation[0] == 1 && p.dilation[1] == 1 && core::int8_depthwise::pays_off(lo.sizes[2] * lo.sizes[3]);
}

inline void run_int8_depthwise(const Tensor& input, const Tensor& weight, const Layout& li, const Layout& lw,
                               const Layout& lo, const core::conv2d::Params& p, const Operands& ops, Out& o) {
  namespace dw = core::int8_depthwise;
  Input x(input), w(weight);
  x.read(li, !is_contiguous(li));
  w.read(lw, !is_contiguous(lw));
  const int64_t C = lw.sizes[0], taps = lw.sizes[2] * lw.sizes[3];
  dw::Problem pb;
  pb.wq = w.data<int8_t>();
  pb.w_zp = ops.w_zp.empty() ? nullptr : ops.w_zp.data();
  pb.x = x.data<uint8_t>();
  pb.x_signed = ops.type == qc::QType::kInt8;
  pb.x_zero_point = ops.in.zero_point;
  static_cast<core::int8_epilogue::Geometry&>(pb) = geometry(li, lw, lo, p);
  pb.requant = ops.requant();
  pb.out = static_cast<uint8_t*>(o.raw());
  thread_local std::vector<float> wf;  // plane by plane: the weights as float integers [C][KH][KW]
  if (dw::needs_float_weights(pb)) {
    wf.resize(std::max(wf.size(), static_cast<size_t>(C * taps)));
    for (int64_t c = 0; c < C; ++c) {
      const float zp = pb.w_zp ? pb.w_zp[c] : 0.0f;
      for (int64_t k = 0; k < taps; ++k) wf[c * taps + k] = static_cast<float>(pb.wq[c * taps + k]) - zp;
    }
    pb.w = wf.data();
  }
  dw::run(pb, Parallel{});
}

// ---- the ops' bodies --------------------------------------------------------------------------

// quantized_conv2d(_packed): `weight_size` non-null when `weight` is int8 panels (groups 1).
inline Tensor& conv2d_into(Context& ctx, const char* op, const Tensor& input, double input_scale,
                           int64_t input_zero_point, const Tensor& weight, const IntList* weight_size,
                           const Tensor& weight_scale, const OptTensor& weight_zero_point, const OptTensor& bias,
                           IntList stride, IntList padding, IntList dilation, int64_t groups, double output_scale,
                           int64_t output_zero_point, int64_t output_min, int64_t output_max, Tensor& out) {
  namespace conv = core::conv2d;
  const bool packed = weight_size != nullptr;
  Status st;
  Layout li, lw, lpacked;
  Operands ops;
  conv::Params p;
  p.groups = groups;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  bool ok = conv::pair("stride", stride.data(), stride.size(), p.stride, st) &&
      conv::pair("padding", padding.data(), padding.size(), p.padding, st) &&
      conv::pair("dilation", dilation.data(), dilation.size(), p.dilation, st) &&
      (!packed || (check_cpu(op, "packed_weight", weight, st) && layout_of(weight, "packed_weight", lpacked, st) &&
                   packed_conv_weight(op, *weight_size, lpacked, groups, lw, st))) &&
      read_operands(op, input, input_scale, input_zero_point, weight, weight_scale, weight_zero_point, bias,
                    output_scale, output_zero_point, output_min, output_max, out, li, lw, ops, st, packed) &&
      conv::out_shape(li, lw, nullptr, p, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      o.open({&input, &weight}, false, is_contiguous(o.layout()), st);
  if (ok && int8_conv(p, ops)) {
    run_int8_conv(input, weight, packed, li, lw, o.layout(), p, ops, o);
    return o.finish();
  }
  if (ok && !packed && int8_depthwise(li, lw, o.layout(), p) &&
      core::int8_depthwise::takes_weight_zero_points(ops.w_zp.empty() ? nullptr : ops.w_zp.data(), lw.sizes[0])) {
    run_int8_depthwise(input, weight, li, lw, o.layout(), p, ops, o);
    return o.finish();
  }
  if (ok) read_as_floats(input, weight, li, lw, ops, packed);
  Floats acc(Slot::kAcc);
  acc.resize(ok ? o.layout().numel() : 0);
  conv::Problem pb;
  const Layout lacc = ok ? contiguous_layout(o.layout()) : Layout{};
  ok = ok && conv::make_problem(ops.x.data(), li, packed ? nullptr : ops.w.data(), lw, nullptr, nullptr, acc.data(),
                                lacc, p, pb, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  pb.packed_i8 = packed ? weight.const_data_ptr<int8_t>() : nullptr;
  conv::run(pb, Parallel{});
  with_qtype(ops.type, [&](auto tag) {
    requantize(acc.data(), lacc.sizes[0], lacc.sizes[1], lacc.sizes[2] * lacc.sizes[3], ops, o.data<decltype(tag)>());
  });
  return o.finish();
}

// quantized_linear(_packed): `packed_n` >= 0 when `weight` is int8 panels for that many outputs.
inline Tensor& linear_into(Context& ctx, const char* op, const Tensor& input, double input_scale,
                           int64_t input_zero_point, const Tensor& weight, int64_t packed_n, const Tensor& weight_scale,
                           const OptTensor& weight_zero_point, const OptTensor& bias, double output_scale,
                           int64_t output_zero_point, int64_t output_min, int64_t output_max, Tensor& out) {
  namespace ge = core::gemm_entry;
  const bool packed = packed_n >= 0;
  Status st;
  Layout li, lw, lpacked;
  Operands ops;
  int ndim = 0;
  int64_t sizes[core::kMaxDims];
  Out o(out);
  bool ok = (!packed || (check_cpu(op, "packed_weight", weight, st) && layout_of(weight, "packed_weight", lpacked, st) &&
                         ge::packed_weight(lpacked, packed_n, lw, st, op))) &&
      read_operands(op, input, input_scale, input_zero_point, weight, weight_scale, weight_zero_point, bias,
                    output_scale, output_zero_point, output_min, output_max, out, li, lw, ops, st, packed);
  if (ok) read_as_floats(input, weight, li, lw, ops, packed);
  if (ok && lw.ndim != 2) ok = st.fail("%s: weight must be 2-D [out, in], got %s", op, core::ShapeStr(lw).c_str());
  ok = ok && ge::linear_out_shape(li, lw, nullptr, ndim, sizes, st) && o.resize(op, ndim, sizes, st) &&
      o.open({&input, &weight}, false, is_contiguous(o.layout()), st);
  Floats acc(Slot::kAcc);
  acc.resize(ok ? o.layout().numel() : 0);
  const Layout lacc = ok ? contiguous_layout(o.layout()) : Layout{};
  core::gemm::Args g;
  // linear_args reads B through the weight's strides; a packed weight is read from its panels
  ok = ok && ge::linear_args(ops.x.data(), li, packed ? nullptr : ops.w.data(), lw, nullptr, nullptr, acc.data(),
                             lacc, g, st);
  ETFUSE_CHECK(ctx, ok, st, out);
  if (packed) {
    g.B = nullptr;
    g.packed_b_i8 = weight.const_data_ptr<int8_t>();
  }
  const int64_t n = lw.sizes[0];
  if (packed && g.M <= kGemvMaxRows) {
    panels_rows(ops.x.data(), g.M, lw.sizes[1], lw.sizes[1], weight.const_data_ptr<int8_t>(), n, acc.data());
  } else {
    ge::Clamp none;
    none.on = false;
    ge::run(g, none, Parallel{});
  }
  with_qtype(ops.type, [&](auto tag) {
    requantize(acc.data(), n ? lacc.numel() / n : 0, n, 1, ops, o.data<decltype(tag)>());
  });
  return o.finish();
}

}  // namespace quantized_gemm
}  // namespace adapter
}  // namespace etfuse
