// conv2d::run against a plain loop, on every ISA this CPU has and this build compiles
// ("baseline", "avx2", "avx512" on x86-64; "baseline", "neon" on aarch64): depthwise 3x3, 5x5 and
// 7x7 at stride 1 and 2 with padding 0-3 (also unequal), odd map sizes from 1 to 37 wide, channel
// counts not multiples of 4, two images, strided input and output planes; the direct conv of a
// stem (groups 1, 1-3 input channels, 1-17 output channels), a grouped one and wider convs
// (5-16 input channels, 13-40 output channels, output rows 10-30 wide); each with and
// without bias, per-channel scale (a folded batch norm) and the clamp (none, min, both). The
// work is split into ranges of tasks as a thread pool would. tests/test_conv2d_isa.py builds it
// natively and for aarch64 (run under qemu-aarch64). Prints one line per ISA checked, with how
// many cases took the NEON depthwise rows; exits 1 at the first mismatch, naming the case.
#include "check_random.h"
#include "isa_loop.h"
#include "core/conv2d.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <vector>

namespace conv = etfuse::core::conv2d;
using etfuse::core::Layout;

namespace {

using check_random::next_value;

struct Case {
  int64_t N, C, Cout, groups, H, W, KH, KW, sh, sw, ph, pw;
  int epilogue;  // bit 0 bias, bit 1 scale
  int clamp;     // 0 none, 1 min only, 2 both
  bool strided;  // input rows and output rows padded, elements 1 apart
};

Layout make_layout(int64_t n, int64_t c, int64_t h, int64_t w, int64_t row) {
  Layout l;
  l.ndim = 4;
  const int64_t sizes[4] = {n, c, h, w}, strides[4] = {c * h * row, h * row, row, 1};
  for (int d = 0; d < 4; ++d) l.sizes[d] = sizes[d], l.strides[d] = strides[d];
  return l;
}

int rows_cases = 0, blocks_cases = 0;

bool check(const Case& c, const char* isa) {
  conv::Params p;
  p.stride[0] = c.sh, p.stride[1] = c.sw, p.padding[0] = c.ph, p.padding[1] = c.pw, p.groups = c.groups;
  p.has_min = c.clamp >= 1, p.min = -0.25f;
  p.has_max = c.clamp == 2, p.max = 0.5f;
  const int64_t Cg = c.C / c.groups, OH = (c.H + 2 * c.ph - c.KH) / c.sh + 1, OW = (c.W + 2 * c.pw - c.KW) / c.sw + 1;
  // strided output rows only where the path takes them (out_is_flat; the adapter copies otherwise)
  const int64_t irow = c.W + (c.strided ? 3 : 0);
  int64_t orow = OW + (c.strided ? 5 : 0);
  if (c.strided) {
    conv::Problem probe;
    probe.li = make_layout(c.N, c.C, c.H, c.W, irow);
    probe.lw = make_layout(c.Cout, Cg, c.KH, c.KW, c.KW);
    probe.lo = make_layout(c.N, c.Cout, OH, OW, orow);
    probe.p = p;
    if (!conv::out_is_flat(probe)) orow = OW;
  }
  const Layout li = make_layout(c.N, c.C, c.H, c.W, irow), lw = make_layout(c.Cout, Cg, c.KH, c.KW, c.KW);
  const Layout lo = make_layout(c.N, c.Cout, OH, OW, orow);
  std::vector<float> in(static_cast<size_t>(c.N * c.C * c.H * irow)), w(static_cast<size_t>(c.Cout * Cg * c.KH * c.KW));
  std::vector<float> bias(c.Cout), scale(c.Cout), out(static_cast<size_t>(c.N * c.Cout * OH * orow), 12345.0f);
  for (auto& v : in) v = next_value();
  for (auto& v : w) v = next_value();
  for (auto& v : bias) v = next_value();
  for (auto& v : scale) v = next_value() * 2.0f;
  Layout lb;
  lb.ndim = 1, lb.sizes[0] = c.Cout, lb.strides[0] = 1;
  conv::Problem pb;
  etfuse::core::Status st;
  if (!conv::make_problem(in.data(), li, w.data(), lw, (c.epilogue & 1) ? bias.data() : nullptr, &lb, out.data(), lo,
                          p, pb, st)) {
    std::printf("make_problem failed\n");
    return false;
  }
  if (c.epilogue & 2) pb.scale = scale.data(), pb.scale_s = 1;
  if (conv::uses_depthwise_blocks(pb)) {
    ++blocks_cases;
  } else if (conv::uses_depthwise_rows(pb)) {
    ++rows_cases;
  }
  // tasks in ranges of `grain`, as the thread pool hands them out
  conv::run(pb, [](int64_t begin, int64_t end, int64_t grain, auto&& fn) {
    for (int64_t b = begin; b < end; b += grain) fn(b, b + grain < end ? b + grain : end);
  });
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t co = 0; co < c.Cout; ++co)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double sum = 0.0, magnitude = 0.0;
          const int64_t g = co / (c.Cout / c.groups);
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                const int64_t ih = oh * c.sh + kh - c.ph, iw = ow * c.sw + kw - c.pw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const double x = in[((n * c.C + g * Cg + ci) * c.H + ih) * irow + iw];
                const double wv = w[((co * Cg + ci) * c.KH + kh) * c.KW + kw];
                sum += x * wv;
                magnitude += std::fabs(x * wv);
              }
          double want = sum;
          if (c.epilogue & 2) want *= scale[co], magnitude *= std::fabs(scale[co]);
          if (c.epilogue & 1) want += bias[co];
          if (p.has_min && want < p.min) want = p.min;
          if (p.has_max && want > p.max) want = p.max;
          const double got = out[((n * c.Cout + co) * OH + oh) * orow + ow];
          if (!(std::fabs(got - want) <= 1e-5 * (magnitude + 1))) {
            std::printf("MISMATCH isa=%s N=%lld C=%lld Cout=%lld groups=%lld H=%lld W=%lld K=%lldx%lld stride=%lldx%lld "
                        "pad=%lldx%lld epilogue=%d clamp=%d strided=%d at (%lld, %lld, %lld, %lld): got %.7g, want %.7g\n",
                        isa, (long long)c.N, (long long)c.C, (long long)c.Cout, (long long)c.groups, (long long)c.H,
                        (long long)c.W, (long long)c.KH, (long long)c.KW, (long long)c.sh, (long long)c.sw,
                        (long long)c.ph, (long long)c.pw, c.epilogue, c.clamp, int(c.strided), (long long)n,
                        (long long)co, (long long)oh, (long long)ow, got, want);
            return false;
          }
        }
  // the padding between output rows is not written
  for (int64_t i = 0; i < c.N * c.Cout * OH; ++i)
    for (int64_t ow = OW; ow < orow; ++ow)
      if (out[i * orow + ow] != 12345.0f) {
        std::printf("WRITE PAST ROW isa=%s H=%lld W=%lld K=%lld stride=%lld\n", isa, (long long)c.H, (long long)c.W,
                    (long long)c.KH, (long long)c.sh);
        return false;
      }
  return true;
}

}  // namespace

int main() {
  const int64_t sizes[][2] = {{1, 1}, {3, 4}, {5, 5}, {7, 9}, {8, 13}, {12, 12}, {17, 20}, {9, 37}, {24, 24}};
  const int64_t channels[] = {1, 3, 6};
  return check_isa_loop::for_each_isa({"baseline", "avx2", "avx512", "neon"}, [&](const char* isa) {
    int cases = 0;
    rows_cases = blocks_cases = 0;
    int variant = 0;  // cycles through the epilogues, clamps and layouts
    // depthwise
    for (int64_t K : {3, 5, 7})
      for (int64_t s : {1, 2})
        for (const auto& hw : sizes)
          for (int64_t C : channels)
            for (int64_t pad : {0, 1, 2, 3}) {
              const int64_t ph = pad, pw = (pad + variant) % 4;  // unequal paddings too
              if (hw[0] + 2 * ph < K || hw[1] + 2 * pw < K) continue;
              const Case c{1 + variant % 2, C, C, C, hw[0], hw[1], K, K, s, s, ph, pw, variant % 4, variant % 3,
                           variant % 5 == 0};
              ++variant;
              if (!check(c, isa)) return false;
              ++cases;
            }
    // depthwise maps past the NEON blocks kernel's pixels (its rows kernel's)
    for (int64_t K : {3, 5})
      for (int64_t s : {1, 2}) {
        const Case c{1, 5, 5, 5, s == 1 ? 52 : 100, s == 1 ? 50 : 98, K, K, s, s, K / 2, K / 2, variant % 4, variant % 3,
                     variant % 5 == 0};
        ++variant;
        if (!check(c, isa)) return false;
        ++cases;
      }
    // the direct conv: a stem (groups 1) and a grouped conv, 3x3
    for (int64_t s : {1, 2})
      for (int64_t Cin : {1, 3})
        for (int64_t Cout : {1, 3, 4, 5, 8, 17})
          for (const auto& hw : {std::array<int64_t, 2>{9, 17}, std::array<int64_t, 2>{16, 33}, std::array<int64_t, 2>{20, 24}})
            for (int64_t groups : {int64_t(1), Cin}) {
              if (groups > 1 && Cout % groups) continue;
              const Case c{1 + variant % 2, Cin, Cout, groups, hw[0], hw[1], 3, 3, s, s, 1, variant % 2, variant % 4,
                           variant % 3, variant % 5 == 0};
              ++variant;
              if (!check(c, isa)) return false;
              ++cases;
            }
    // wide output rows with more channels (groups 1): NEON's direct kernel takes them whatever
    // the channels (Kernels::direct_rows, from 8 wide: the 10x10 map), 8 planes a block and the
    // remainder; 40 channels of 144 taps only for that rule
    for (int64_t s : {1, 2})
      for (int64_t Cin : {5, 16})
        for (int64_t Cout : {13, 24, 40})
          for (const auto& hw : {std::array<int64_t, 2>{14, 25}, std::array<int64_t, 2>{27, 30}, std::array<int64_t, 2>{10, 10}}) {
            const Case c{1 + variant % 2, Cin, Cout, 1, hw[0], hw[1], 3, 3, s, s, 1, variant % 2, variant % 4,
                         variant % 3, variant % 5 == 0};
            ++variant;
            if (!check(c, isa)) return false;
            ++cases;
          }
    std::printf("isa %s: %d cases match, %d on depthwise rows, %d on depthwise blocks\n", isa, cases, rows_cases,
                blocks_cases);
    return true;
  });
}
