// The int8 conv and linear paths (ops/quantized_gemm.h's) against a plain integer reference with
// the same requantization, bit-exact: the float path (8-bit values as float integers on the
// float32 conv / GEMM cores, core/int8_gemm.h's epilogue) on every ISA this build has, and the
// int8 kernels of core/int8_pointwise.h where they run (x86 VNNI; aarch64 sdot, and its smlal
// kernel forced on a core with dot products). Shapes with channels, K and pixels off every
// vector width, int8 and uint8 activations, nonzero zero points, per-tensor and per-channel
// scales, rounding ties, relu / hardtanh clamps, 1x1 and spatial convs (im2col), rows and packed
// GEMM panels. Depthwise convs (groups = channels, ops' run_int8_depthwise and float path): the
// float path on every ISA, and core/int8_depthwise.h's kernel where it runs (x86 AVX-512BW,
// aarch64 NEON): 3x3, 5x5 and other sizes, stride 1 and 2, paddings, odd channel counts and
// maps, weight zero points. tests/test_int8_isa.py builds it natively and for aarch64 (run under qemu).
// Prints one line per path; exits 1 at the first mismatch, naming the case.
//
//   int8_check                          the checks
//   int8_check time PATH C K H W REPS   REPS runs of a 1x1 conv C <- K on H x W (uint8), for
//                                       counting instructions (PATH: float, or a kernel name)
//   int8_check time PATH C H W K S REPS REPS runs of a depthwise KxK conv, stride S, padding K / 2,
//                                       C channels on H x W (uint8, relu6-like clamp; PATH:
//                                       dw-float, or dw-neon / dw-avx512)
#include "check_random.h"
#include "isa_loop.h"
#include "core/conv2d.h"
#include "core/gemm.h"
#include "core/int8_depthwise.h"
#include "core/int8_gemm.h"
#include "core/int8_pointwise.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ec = etfuse::core;
namespace pw = etfuse::core::int8_pointwise;
namespace dw = etfuse::core::int8_depthwise;
using ec::int8_epilogue::Requant;

namespace {

uint32_t next() { return check_random::next_bits(); }
int rand_in(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint32_t>(hi - lo + 1)); }

const auto serial = [](int64_t b, int64_t e, int64_t, auto&& fn) { fn(b, e); };

struct Conv {
  int64_t N = 1, Cin = 1, H = 1, W = 1, Cout = 1, KH = 1, KW = 1, stride = 1, pad = 0, dil = 1;
  int64_t OH() const { return (H + 2 * pad - dil * (KH - 1) - 1) / stride + 1; }
  int64_t OW() const { return (W + 2 * pad - dil * (KW - 1) - 1) / stride + 1; }
  int64_t K() const { return Cin * KH * KW; }
  bool pointwise() const { return KH == 1 && KW == 1 && stride == 1 && pad == 0; }
};

struct Quant {
  bool is_signed = true;
  int32_t x_zp = 0;
  std::vector<float> scale, bias;  // scale per output channel (all equal: per tensor); bias empty: none
  float inv = 1.0f, zp = 0.0f, lo = -128.0f, hi = 127.0f;
  Requant requant() const { return Requant{scale.data(), bias.empty() ? nullptr : bias.data(), inv, zp, lo, hi}; }
};

// requant_loop's steps, one float32 operation each.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
int32_t reference_requant(int64_t acc, int64_t c, const Quant& q) {
  float y = static_cast<float>(acc) * q.scale[c];
  if (!q.bias.empty()) y = y + q.bias[c];
  float r = std::rint(y * q.inv) + q.zp;
  r = r < q.lo ? q.lo : r;
  r = r > q.hi ? q.hi : r;
  return static_cast<int32_t>(r);
}

int32_t byte_value(uint8_t b, bool is_signed) { return is_signed ? static_cast<int8_t>(b) : b; }

// out [N][Cout][OH][OW] as integers.
std::vector<int32_t> reference_conv(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                                    const Quant& q) {
  const int64_t OH = c.OH(), OW = c.OW();
  std::vector<int32_t> out(static_cast<size_t>(c.N * c.Cout * OH * OW));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t co = 0; co < c.Cout; ++co)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t acc = 0;
          for (int64_t ci = 0; ci < c.Cin; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                const int64_t ih = oh * c.stride - c.pad + kh * c.dil, iw = ow * c.stride - c.pad + kw * c.dil;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;  // padding: x_zp, x - x_zp = 0
                const int32_t xv = byte_value(x[((n * c.Cin + ci) * c.H + ih) * c.W + iw], q.is_signed) - q.x_zp;
                acc += int64_t(xv) * w[((co * c.Cin + ci) * c.KH + kh) * c.KW + kw];
              }
          out[((n * c.Cout + co) * OH + oh) * OW + ow] = reference_requant(acc, co, q);
        }
  return out;
}

// The packed ops' GEMM panels [C16 / 16][K][16] of rows w[C][K].
std::vector<int8_t> panels_of(const std::vector<int8_t>& w, int64_t C, int64_t K) {
  const int64_t P = ec::gemm::kPanel;
  std::vector<int8_t> p(static_cast<size_t>(ec::gemm::packed_panels(C) * K * P), 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < K; ++k) p[(c / P) * K * P + k * P + c % P] = w[c * K + k];
  return p;
}

ec::Layout layout4(int64_t a, int64_t b, int64_t c, int64_t d) {
  ec::Layout l;
  l.ndim = 4;
  const int64_t s[4] = {a, b, c, d};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    l.sizes[i] = s[i];
    l.strides[i] = stride;
    stride *= s[i];
  }
  return l;
}

template <class T>
void requantize(const float* acc, int64_t outer, int64_t channels, int64_t inner, const Requant& r, T* q) {
  const bool per = inner == 1;
  const auto f = per ? ec::int8_gemm::requant_rows<T, true>() : ec::int8_gemm::requant_rows<T, false>();
  const int64_t rows = per ? outer : outer * channels, width = per ? channels : inner;
  f(acc, rows, width, 0, channels, r, q);
}

// ops' float path of a conv: x and w as float integers, conv2d's core (the GEMM for 1x1, or the
// int8 panels with `packed`), the epilogue.
std::vector<uint8_t> float_conv(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                                const Quant& q, bool packed) {
  std::vector<float> xf(x.size()), wf(w.size());
  if (q.is_signed) ec::int8_gemm::integers(reinterpret_cast<const int8_t*>(x.data()), int64_t(x.size()), float(q.x_zp), xf.data());
  else ec::int8_gemm::integers(x.data(), int64_t(x.size()), float(q.x_zp), xf.data());
  ec::int8_gemm::integers(w.data(), int64_t(w.size()), 0.0f, wf.data());
  const std::vector<int8_t> panels = packed ? panels_of(w, c.Cout, c.K()) : std::vector<int8_t>();
  std::vector<float> acc(static_cast<size_t>(c.N * c.Cout * c.OH() * c.OW()));
  ec::conv2d::Params p;
  p.stride[0] = p.stride[1] = c.stride;
  p.padding[0] = p.padding[1] = c.pad;
  p.dilation[0] = p.dilation[1] = c.dil;
  ec::conv2d::Problem pb;
  ec::Status st;
  const ec::Layout li = layout4(c.N, c.Cin, c.H, c.W), lw = layout4(c.Cout, c.Cin, c.KH, c.KW),
                   lo = layout4(c.N, c.Cout, c.OH(), c.OW());
  if (!ec::conv2d::make_problem(xf.data(), li, packed ? nullptr : wf.data(), lw, nullptr, nullptr, acc.data(), lo, p, pb,
                                st)) {
    std::printf("make_problem: %s\n", st.msg);
    std::exit(2);
  }
  pb.packed_i8 = packed ? panels.data() : nullptr;
  ec::conv2d::run(pb, serial);
  std::vector<uint8_t> out(acc.size());
  if (q.is_signed) requantize(acc.data(), c.N, c.Cout, c.OH() * c.OW(), q.requant(), reinterpret_cast<int8_t*>(out.data()));
  else requantize(acc.data(), c.N, c.Cout, c.OH() * c.OW(), q.requant(), out.data());
  return out;
}

// ops' int8 kernel path: 1x1 in place, others per image over the im2col.
std::vector<uint8_t> kernel_conv(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                                 const Quant& q, bool packed) {
  const std::vector<int8_t> panels = packed ? panels_of(w, c.Cout, c.K()) : std::vector<int8_t>();
  std::vector<uint8_t> out(static_cast<size_t>(c.N * c.Cout * c.OH() * c.OW()), 0xA5);
  pw::Problem pb;
  pb.panels = packed;
  pb.w = packed ? panels.data() : w.data();
  pb.x = x.data();
  pb.x_signed = q.is_signed;
  pb.x_zero_point = q.x_zp;
  pb.N = c.N;
  pb.K = c.K();
  pb.C = c.Cout;
  pb.P = c.OH() * c.OW();
  pb.requant = q.requant();
  pb.out = out.data();
  if (c.pointwise()) {
    pw::conv(pb, serial);
    return out;
  }
  ec::int8_epilogue::Geometry g;
  g.N = 1, g.C = c.Cin, g.H = c.H, g.W = c.W, g.KH = c.KH, g.KW = c.KW, g.OH = c.OH(), g.OW = c.OW();
  for (int d = 0; d < 2; ++d) g.stride[d] = c.stride, g.padding[d] = c.pad, g.dilation[d] = c.dil;
  std::vector<uint8_t> cols(static_cast<size_t>(c.K() * pb.P)), border(static_cast<size_t>(c.Cin * (c.H + 2 * c.pad) * (c.W + 2 * c.pad) + 64));
  pb.N = 1;
  for (int64_t n = 0; n < c.N; ++n) {
    pw::im2col(g, x.data() + n * c.Cin * c.H * c.W, static_cast<uint8_t>(q.x_zp), border.data(), cols.data());
    pb.x = cols.data();
    pb.out = out.data() + n * c.Cout * pb.P;
    pw::conv(pb, serial);
  }
  return out;
}

// ops' float path of a linear: x [M][K] @ w[N][K]^T on the GEMM, or (packed, M <= 4) panels_rows.
std::vector<uint8_t> float_linear(int64_t M, int64_t N, int64_t K, const std::vector<uint8_t>& x,
                                  const std::vector<int8_t>& w, const Quant& q, bool packed) {
  std::vector<float> xf(x.size()), wf(w.size()), acc(static_cast<size_t>(M * N));
  if (q.is_signed) ec::int8_gemm::integers(reinterpret_cast<const int8_t*>(x.data()), int64_t(x.size()), float(q.x_zp), xf.data());
  else ec::int8_gemm::integers(x.data(), int64_t(x.size()), float(q.x_zp), xf.data());
  ec::int8_gemm::integers(w.data(), int64_t(w.size()), 0.0f, wf.data());
  const std::vector<int8_t> panels = packed ? panels_of(w, N, K) : std::vector<int8_t>();
  if (packed && M <= 4) {
    for (int64_t m = 0; m < M; m += 2) {
      const int r = M - m >= 2 ? 2 : 1;
      (r == 2 ? ec::int8_gemm::panels_rows<2>() : ec::int8_gemm::panels_rows<1>())(
          xf.data() + m * K, K, K, panels.data(), 0, ec::gemm::packed_panels(N), acc.data() + m * N, N);
    }
  } else {
    ec::gemm::Args g;
    g.M = M, g.N = N, g.K = K;
    g.A = xf.data(), g.a_rs = K, g.a_cs = 1;
    if (packed) g.packed_b_i8 = panels.data();
    else g.B = wf.data(), g.b_rs = 1, g.b_cs = K;
    g.C = acc.data(), g.c_rs = N, g.c_cs = 1;
    g.clamp = false;
    ec::gemm::run(g, serial);
  }
  std::vector<uint8_t> out(acc.size());
  if (q.is_signed) requantize(acc.data(), M, N, 1, q.requant(), reinterpret_cast<int8_t*>(out.data()));
  else requantize(acc.data(), M, N, 1, q.requant(), out.data());
  return out;
}

// Activations, weights and qparams for a case; `variant` picks scales, bias, clamp and ties.
Quant make_quant(int64_t C, bool is_signed, int variant) {
  Quant q;
  q.is_signed = is_signed;
  q.x_zp = is_signed ? rand_in(-20, 20) : rand_in(100, 150);
  if (variant % 5 == 4) q.x_zp = is_signed ? -128 : 255;  // the range's end
  const bool per_channel = variant % 2 == 1;
  const float s0 = 0.0005f + 0.0001f * static_cast<float>(rand_in(0, 20));
  q.scale.resize(static_cast<size_t>(C));
  for (auto& s : q.scale) s = per_channel ? s0 * (0.5f + static_cast<float>(rand_in(0, 100)) / 100.0f) : s0;
  if (variant % 3 != 0) {
    q.bias.resize(static_cast<size_t>(C));
    for (auto& b : q.bias) b = static_cast<float>(rand_in(-3000, 3000)) / 1000.0f;
  }
  q.inv = 1.0f / (0.02f + 0.005f * static_cast<float>(rand_in(0, 10)));
  q.zp = static_cast<float>(is_signed ? rand_in(-10, 10) : rand_in(100, 140));
  const float tmin = is_signed ? -128.0f : 0.0f, tmax = is_signed ? 127.0f : 255.0f;
  switch (variant % 4) {
    case 0: q.lo = tmin, q.hi = tmax; break;                // none
    case 1: q.lo = q.zp, q.hi = tmax; break;                // relu
    case 2: q.lo = q.zp - 30.0f, q.hi = q.zp + 40.0f; break;  // hardtanh
    default: q.lo = tmin, q.hi = tmax;                        // ties: acc * 0.5 lands on .5
      for (auto& s : q.scale) s = 0.5f;
      q.bias.clear();
      q.inv = 1.0f;
  }
  return q;
}

void fill(std::vector<uint8_t>& x, std::vector<int8_t>& w) {
  for (auto& v : x) v = static_cast<uint8_t>(next());
  for (auto& v : w) v = static_cast<int8_t>(next());
  if (!w.empty()) w[0] = -128;  // the products' extreme
}

bool same(const std::vector<uint8_t>& got, const std::vector<int32_t>& want, bool is_signed, const char* path,
          const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (byte_value(got[i], is_signed) != want[i]) {
      std::printf("MISMATCH path=%s %s at %zu: got %d, want %d\n", path, what.c_str(), i, byte_value(got[i], is_signed),
                  want[i]);
      return false;
    }
  }
  return true;
}

std::string describe(const Conv& c, const Quant& q, int variant, bool packed) {
  char b[256];
  std::snprintf(b, sizeof b, "conv N=%lld Cin=%lld H=%lld W=%lld Cout=%lld k=%lldx%lld stride=%lld pad=%lld dil=%lld %s x_zp=%d variant=%d packed=%d",
                (long long)c.N, (long long)c.Cin, (long long)c.H, (long long)c.W, (long long)c.Cout, (long long)c.KH,
                (long long)c.KW, (long long)c.stride, (long long)c.pad, (long long)c.dil, q.is_signed ? "int8" : "uint8",
                q.x_zp, variant, int(packed));
  return b;
}

std::vector<Conv> conv_cases() {
  std::vector<Conv> cs;
  const int64_t couts[] = {1, 3, 8, 17, 24, 40};
  const int64_t cins[] = {1, 3, 4, 5, 16, 27, 96};
  const int64_t maps[][2] = {{1, 1}, {1, 7}, {2, 4}, {3, 5}, {4, 4}, {7, 9}, {8, 8}, {5, 13}, {10, 13}};
  for (int64_t co : couts)
    for (int64_t ci : cins)
      for (const auto& m : maps) {
        Conv c;
        c.Cin = ci, c.Cout = co, c.H = m[0], c.W = m[1], c.N = (co + ci) % 2 + 1;
        cs.push_back(c);
      }
  // spatial: through the im2col
  const int64_t spatial[][9] = {// Cin, H, W, Cout, KH, KW, stride, pad, dil
                                {3, 9, 11, 8, 3, 3, 2, 1, 1},  {5, 7, 7, 17, 3, 3, 1, 1, 1}, {4, 12, 10, 24, 3, 3, 2, 1, 1},
                                {2, 6, 9, 5, 1, 3, 1, 0, 1},   {3, 10, 10, 9, 3, 3, 1, 2, 2}, {7, 5, 6, 3, 2, 2, 2, 0, 1},
                                {16, 8, 8, 16, 1, 1, 2, 0, 1}, {6, 13, 17, 40, 5, 5, 3, 2, 1},
                                // stride 2 over rows of 16 outputs and more (aarch64's im2col: a vld2 per 16)
                                {3, 5, 37, 8, 3, 3, 2, 1, 1},  {3, 4, 64, 9, 3, 3, 2, 1, 1}};
  for (const auto& s : spatial) {
    Conv c;
    c.Cin = s[0], c.H = s[1], c.W = s[2], c.Cout = s[3], c.KH = s[4], c.KW = s[5], c.stride = s[6], c.pad = s[7],
    c.dil = s[8], c.N = 2;
    cs.push_back(c);
  }
  return cs;
}

// Every case on one path ("float", or the int8 kernel's name); returns the number checked, -1 on
// a mismatch.
int check_path(const char* path) {
  const bool kernel = std::strcmp(path, "float") != 0;
  check_random::state = 12345;
  int cases = 0, variant = 0;
  for (const Conv& c : conv_cases()) {
    for (bool is_signed : {true, false}) {
      for (bool packed : {false, true}) {
        ++variant;
        const Quant q = make_quant(c.Cout, is_signed, variant);
        std::vector<uint8_t> x(static_cast<size_t>(c.N * c.Cin * c.H * c.W));
        std::vector<int8_t> w(static_cast<size_t>(c.Cout * c.K()));
        fill(x, w);
        const std::vector<int32_t> want = reference_conv(c, x, w, q);
        if (!kernel && packed && !c.pointwise()) continue;  // the float packed path is 1x1 or spatial alike; keep it short
        const std::vector<uint8_t> got = kernel ? kernel_conv(c, x, w, q, packed) : float_conv(c, x, w, q, packed);
        if (!same(got, want, is_signed, path, describe(c, q, variant, packed))) return -1;
        ++cases;
      }
    }
  }
  if (kernel) return cases;
  // linear (float path): x [M][K] rows
  const int64_t ms[] = {1, 2, 3, 4, 5, 9}, ns[] = {1, 7, 16, 17, 40}, ks[] = {1, 3, 4, 9, 64, 300};
  for (int64_t M : ms)
    for (int64_t N : ns)
      for (int64_t K : ks)
        for (bool is_signed : {true, false})
          for (bool packed : {false, true}) {
            ++variant;
            const Quant q = make_quant(N, is_signed, variant);
            std::vector<uint8_t> x(static_cast<size_t>(M * K));
            std::vector<int8_t> w(static_cast<size_t>(N * K));
            fill(x, w);
            std::vector<int32_t> want(static_cast<size_t>(M * N));
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                int64_t acc = 0;
                for (int64_t k = 0; k < K; ++k) acc += int64_t(byte_value(x[m * K + k], is_signed) - q.x_zp) * w[n * K + k];
                want[m * N + n] = reference_requant(acc, n, q);
              }
            char b[160];
            std::snprintf(b, sizeof b, "linear M=%lld N=%lld K=%lld %s variant=%d packed=%d", (long long)M, (long long)N,
                          (long long)K, is_signed ? "int8" : "uint8", variant, int(packed));
            if (!same(float_linear(M, N, K, x, w, q, packed), want, is_signed, path, b)) return -1;
            ++cases;
          }
  return cases;
}

// ---- depthwise: Conv with Cin = Cout = C (groups C), the weight [C][1][KH][KW] -------------------

std::vector<int32_t> reference_dw(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                                  const std::vector<int32_t>& w_zp, const Quant& q) {
  const int64_t OH = c.OH(), OW = c.OW(), C = c.Cout;
  std::vector<int32_t> out(static_cast<size_t>(c.N * C * OH * OW));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t acc = 0;
          for (int64_t kh = 0; kh < c.KH; ++kh)
            for (int64_t kw = 0; kw < c.KW; ++kw) {
              const int64_t ih = oh * c.stride - c.pad + kh, iw = ow * c.stride - c.pad + kw;
              if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
              const int32_t xv = byte_value(x[((n * C + ch) * c.H + ih) * c.W + iw], q.is_signed) - q.x_zp;
              acc += int64_t(xv) * (w[(ch * c.KH + kh) * c.KW + kw] - (w_zp.empty() ? 0 : w_zp[ch]));
            }
          out[((n * C + ch) * OH + oh) * OW + ow] = reference_requant(acc, ch, q);
        }
  return out;
}

// ops' float path of a depthwise conv: float integers, conv2d's core with groups = C, the epilogue.
std::vector<uint8_t> float_dw(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                              const std::vector<float>& w_zp, const Quant& q) {
  const int64_t C = c.Cout, taps = c.KH * c.KW;
  std::vector<float> xf(x.size()), wf(w.size());
  if (q.is_signed) ec::int8_gemm::integers(reinterpret_cast<const int8_t*>(x.data()), int64_t(x.size()), float(q.x_zp), xf.data());
  else ec::int8_gemm::integers(x.data(), int64_t(x.size()), float(q.x_zp), xf.data());
  for (int64_t ch = 0; ch < C; ++ch)
    ec::int8_gemm::integers(w.data() + ch * taps, taps, w_zp.empty() ? 0.0f : w_zp[ch], wf.data() + ch * taps);
  std::vector<float> acc(static_cast<size_t>(c.N * C * c.OH() * c.OW()));
  ec::conv2d::Params p;
  p.stride[0] = p.stride[1] = c.stride;
  p.padding[0] = p.padding[1] = c.pad;
  p.groups = C;
  ec::conv2d::Problem pb;
  ec::Status st;
  const ec::Layout li = layout4(c.N, C, c.H, c.W), lw = layout4(C, 1, c.KH, c.KW), lo = layout4(c.N, C, c.OH(), c.OW());
  if (!ec::conv2d::make_problem(xf.data(), li, wf.data(), lw, nullptr, nullptr, acc.data(), lo, p, pb, st)) {
    std::printf("make_problem: %s\n", st.msg);
    std::exit(2);
  }
  ec::conv2d::run(pb, serial);
  std::vector<uint8_t> out(acc.size());
  if (q.is_signed) requantize(acc.data(), c.N, C, c.OH() * c.OW(), q.requant(), reinterpret_cast<int8_t*>(out.data()));
  else requantize(acc.data(), c.N, C, c.OH() * c.OW(), q.requant(), out.data());
  return out;
}

// ops' int8 depthwise kernel path (run_int8_depthwise).
std::vector<uint8_t> kernel_dw(const Conv& c, const std::vector<uint8_t>& x, const std::vector<int8_t>& w,
                               const std::vector<float>& w_zp, const Quant& q) {
  const int64_t C = c.Cout, taps = c.KH * c.KW;
  std::vector<uint8_t> out(static_cast<size_t>(c.N * C * c.OH() * c.OW()), 0xA5);
  dw::Problem pb;
  pb.wq = w.data();
  pb.w_zp = w_zp.empty() ? nullptr : w_zp.data();
  pb.x = x.data();
  pb.x_signed = q.is_signed;
  pb.x_zero_point = static_cast<float>(q.x_zp);
  pb.N = c.N, pb.C = C, pb.H = c.H, pb.W = c.W, pb.KH = c.KH, pb.KW = c.KW, pb.OH = c.OH(), pb.OW = c.OW();
  for (int d = 0; d < 2; ++d) pb.stride[d] = c.stride, pb.padding[d] = c.pad;
  pb.requant = q.requant();
  pb.out = out.data();
  std::vector<float> wf;
  if (dw::needs_float_weights(pb)) {
    wf.resize(static_cast<size_t>(C * taps));
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t k = 0; k < taps; ++k) wf[ch * taps + k] = static_cast<float>(w[ch * taps + k]) - (pb.w_zp ? pb.w_zp[ch] : 0.0f);
    pb.w = wf.data();
  }
  dw::run(pb, serial);
  return out;
}

std::vector<Conv> dw_cases() {
  std::vector<Conv> cs;
  const int64_t kernels[][4] = {// KH, KW, stride, pad
                                {3, 3, 1, 1}, {3, 3, 2, 1}, {3, 3, 1, 0}, {3, 3, 2, 0}, {5, 5, 1, 2}, {5, 5, 2, 2},
                                {5, 5, 1, 0}, {3, 3, 2, 2}, {1, 1, 1, 0}, {2, 4, 2, 1}, {1, 3, 1, 1}};
  const int64_t maps[][2] = {{1, 1}, {2, 3}, {3, 3}, {4, 7}, {5, 5}, {6, 6}, {7, 9}, {8, 8}, {11, 16}, {12, 12}, {17, 10}, {24, 25}};
  const int64_t chans[] = {1, 3, 17, 24};
  for (const auto& k : kernels)
    for (const auto& m : maps)
      for (int64_t ch : chans) {
        Conv c;
        c.Cin = c.Cout = ch, c.H = m[0], c.W = m[1], c.KH = k[0], c.KW = k[1], c.stride = k[2], c.pad = k[3];
        c.N = (ch + m[0]) % 2 + 1;
        if (c.H + 2 * c.pad < c.KH || c.W + 2 * c.pad < c.KW) continue;
        cs.push_back(c);
      }
  // MobileNetV2's (96 x 96 input): channels and maps
  const int64_t mnv2[][4] = {{96, 48, 48, 2}, {144, 24, 24, 1}, {144, 24, 24, 2}, {192, 12, 12, 1}, {384, 6, 6, 1},
                             {576, 6, 6, 2}, {960, 3, 3, 1}, {32, 48, 48, 1}};
  for (const auto& m : mnv2) {
    Conv c;
    c.Cin = c.Cout = m[0], c.H = m[1], c.W = m[2], c.KH = c.KW = 3, c.stride = m[3], c.pad = 1;
    cs.push_back(c);
  }
  return cs;
}

// Every depthwise case on one path ("dw-float", or the kernel's); the number checked, -1 on a
// mismatch.
int check_dw_path(const char* path) {
  const bool kernel = std::strcmp(path, "dw-float") != 0;
  check_random::state = 777;
  int cases = 0, variant = 0;
  for (const Conv& c : dw_cases()) {
    for (bool is_signed : {true, false}) {
      ++variant;
      const Quant q = make_quant(c.Cout, is_signed, variant);
      std::vector<uint8_t> x(static_cast<size_t>(c.N * c.Cout * c.H * c.W));
      std::vector<int8_t> w(static_cast<size_t>(c.Cout * c.KH * c.KW));
      fill(x, w);
      std::vector<int32_t> zpi;
      std::vector<float> zpf;
      if (variant % 7 == 3) {  // integral weight zero points (the XNNPACK quantizer's are 0)
        for (int64_t ch = 0; ch < c.Cout; ++ch) zpi.push_back(rand_in(-20, 20));
        zpf.assign(zpi.begin(), zpi.end());
      }
      const std::vector<int32_t> want = reference_dw(c, x, w, zpi, q);
      const std::vector<uint8_t> got = kernel ? kernel_dw(c, x, w, zpf, q) : float_dw(c, x, w, zpf, q);
      char b[256];
      std::snprintf(b, sizeof b, "depthwise N=%lld C=%lld H=%lld W=%lld k=%lldx%lld stride=%lld pad=%lld %s x_zp=%d w_zp=%d variant=%d",
                    (long long)c.N, (long long)c.Cout, (long long)c.H, (long long)c.W, (long long)c.KH, (long long)c.KW,
                    (long long)c.stride, (long long)c.pad, is_signed ? "int8" : "uint8", q.x_zp, int(!zpi.empty()), variant);
      if (!same(got, want, is_signed, path, b)) return -1;
      ++cases;
    }
  }
  return cases;
}

// The depthwise kernel's name where core/int8_depthwise.h runs one, null: none.
const char* dw_kernel_name() {
  if (!dw::available()) return nullptr;
#if ETFUSE_HAVE_ARM_NEON
  return "dw-neon";
#else
  return "dw-avx512";
#endif
}

// REPS runs of one depthwise conv (uint8, per-channel scales, bias, a relu6-like clamp) on `path`.
int dw_time_mode(char** argv) {
  const char* path = argv[2];
  Conv c;
  c.Cin = c.Cout = std::atoll(argv[3]), c.H = std::atoll(argv[4]), c.W = std::atoll(argv[5]);
  c.KH = c.KW = std::atoll(argv[6]), c.stride = std::atoll(argv[7]), c.pad = c.KH / 2;
  const int reps = std::atoi(argv[8]);
  Quant q = make_quant(c.Cout, false, 5);
  q.lo = q.zp, q.hi = std::min(255.0f, q.zp + 120.0f);
  std::vector<uint8_t> x(static_cast<size_t>(c.Cout * c.H * c.W));
  std::vector<int8_t> w(static_cast<size_t>(c.Cout * c.KH * c.KW));
  fill(x, w);
  const std::vector<float> none;
  unsigned sum = 0;
  for (int r = 0; r < reps; ++r) {
    const std::vector<uint8_t> out = std::strcmp(path, "dw-float") == 0 ? float_dw(c, x, w, none, q) : kernel_dw(c, x, w, none, q);
    sum += out[static_cast<size_t>(r) % out.size()];
  }
  std::printf("%s %u\n", path, sum);
  return 0;
}

// REPS runs of one 1x1 conv (uint8, per-channel scales, bias, relu) on `path`.
int time_mode(char** argv) {
  const char* path = argv[2];
  Conv c;
  c.Cout = std::atoll(argv[3]), c.Cin = std::atoll(argv[4]), c.H = std::atoll(argv[5]), c.W = std::atoll(argv[6]);
  const int reps = std::atoi(argv[7]);
  const Quant q = make_quant(c.Cout, false, 5);
  std::vector<uint8_t> x(static_cast<size_t>(c.Cin * c.H * c.W));
  std::vector<int8_t> w(static_cast<size_t>(c.Cout * c.K()));
  fill(x, w);
  unsigned sum = 0;
  for (int r = 0; r < reps; ++r) {
    const std::vector<uint8_t> out =
        std::strcmp(path, "float") == 0 ? float_conv(c, x, w, q, false) : kernel_conv(c, x, w, q, false);
    sum += out[static_cast<size_t>(r) % out.size()];
  }
  std::printf("%s %u\n", path, sum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::strcmp(argv[1], "time") == 0) {
    // the smlal kernel is the NEON ISA's, sdot the dot-product one's
    if (std::strcmp(argv[2], "neon-mlal") == 0) ec::set_isa("neon");
    if (std::strcmp(argv[2], "neon-dot") == 0) ec::set_isa("neondot");
    const char* want = std::strcmp(argv[2], "float") == 0 ? nullptr : argv[2];
    if (want && (!pw::kernel_name() || std::strcmp(pw::kernel_name(), want) != 0)) {
      std::printf("no kernel %s here\n", want);
      return 1;
    }
    return time_mode(argv);
  }
  if (argc == 9 && std::strcmp(argv[1], "time") == 0) {
    const bool is_float = std::strcmp(argv[2], "dw-float") == 0;
    if (!is_float && (!dw_kernel_name() || std::strcmp(dw_kernel_name(), argv[2]) != 0)) {
      std::printf("no kernel %s here\n", argv[2]);
      return 1;
    }
    return dw_time_mode(argv);
  }
  return check_isa_loop::for_each_isa(check_isa_loop::kEveryIsa, [](const char* isa) {
    std::vector<std::string> paths = {"float"};
    if (pw::kernel_name()) paths.push_back(pw::kernel_name());
    paths.push_back("dw-float");
    if (dw_kernel_name()) paths.push_back(dw_kernel_name());
    for (const std::string& path : paths) {
      const int cases = path.compare(0, 3, "dw-") == 0 ? check_dw_path(path.c_str()) : check_path(path.c_str());
      if (cases < 0) return false;
      std::printf("isa %s path %s: %d cases match\n", isa, path.c_str(), cases);
    }
    return true;
  });
}
