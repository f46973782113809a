// Decode's read rate over int4 weights in two layouts, one thread, AVX-512 VNNI: the question
// behind linear_dq's next decode layout (docs/performance.md, 2026-11-29).
//
//   g++ -O3 -march=native -o /tmp/q4_layouts benchmarks/q4_layouts.cpp && /tmp/q4_layouts [N] [reps]
//
// One decode step of N x K (K = 2048, int4 in groups of 32, float32 scales, symmetric: q - 8),
// weights on 2 MB pages, best of `reps` (a best-of time is what the loop can do when the core is
// its own, so it can be read on a busy machine), against a plain read of the same bytes:
// * rows: linear_dq's layout (a column's weights contiguous, its scales in an array beside):
//   dot_q4's loop, 128 columns of K a 64-byte load, qx from L1, the scales spread over the lanes by
//   a permute, one horizontal sum a column;
// * rows, scales inline: the same bytes and loop, each 16 groups' 16 scales (64 bytes) stored
//   after their 4 superblocks in the column's stream, so the step reads one stream, not two;
// * rows, scales at the row's end / start: each column's scales after / before all its nibbles
//   (start: the branch dq-rows's pack_int4_scaled rows);
// * + row-sum stream: the same rows loops also reading one float a column from an array of its
//   own (linear_dq's store_q8 reads the weight's row sums so);
// * blocks: 16 columns side by side, a 64-byte line = 8 values of K (one dword) of each, a
//   group's 4 lines then its 16 scales in the same stream; qx broadcast 4 bytes at a time, the
//   16 columns' sums in the lanes (no horizontal sum, no permute).
// Both are checked against a scalar reference before timing.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t K = 2048, G = 32, kGroups = K / G;

const float* g_rs = nullptr;  // a row-sum stream beside (linear_dq's store_q8 reads one)

template <class T>
T* huge(size_t count) {
  const size_t a = size_t{2} << 20, bytes = (count * sizeof(T) + a - 1) / a * a;
  void* p = std::aligned_alloc(a, bytes);
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return static_cast<T*>(p);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

__attribute__((noinline)) int64_t plain_read(const uint8_t* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 256) {
    a0 = _mm512_add_epi32(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi32(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi32(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi32(a3, _mm512_load_si512(p + i + 192));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
}

// rows: byte b of superblock sb of a column: low nibble = k 128 sb + b, high = k 128 sb + 64 + b
// (qx stored in that order, as quantize_q8 does for dot_q4). qsum[g] = sum of qx over group g.
// kInline: w holds each column's 16-group chunks as 4 superblocks then 16 scales (sc unused).
// kRowEnd: w holds each column's superblocks then all its scales (sc unused).
template <int kPrefetch, bool kInline = false, bool kRowEnd = false, bool kRowStart = false>
__attribute__((noinline)) void rows(const uint8_t* w, const float* sc, const int8_t* qx, const int32_t* qsum,
                                    float xs, int64_t N, float* out) {
  const __m512i mask = _mm512_set1_epi8(15);
  const __m512i step = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  constexpr int64_t kChunk = kInline ? 320 : 256;  // bytes of a column's 16 groups
  constexpr int64_t kRow = K / 2 + (kRowEnd || kRowStart ? 4 * kGroups : 0);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* r = kInline ? w + n * (K / 128 / 4) * kChunk : w + n * kRow;
    const float* s = kRowEnd ? reinterpret_cast<const float*>(r + K / 2) : sc + n * kGroups;
    if (kRowStart) s = reinterpret_cast<const float*>(r), r += 4 * kGroups;
    __m512 tot = _mm512_setzero_ps(), bias = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < kGroups; g0 += 16) {
      const uint8_t* chunk = r + g0 / 16 * kChunk;
      const __m512 s16 = kInline ? _mm512_load_ps(reinterpret_cast<const float*>(chunk + 256)) : _mm512_loadu_ps(s + g0);
      bias = _mm512_fmadd_ps(s16, _mm512_cvtepi32_ps(_mm512_loadu_si512(qsum + g0)), bias);
      for (int j = 0; j < 4; ++j) {
        const int64_t sb = g0 / 4 + j;
        if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(chunk + 64 * j) + kPrefetch, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(chunk + 64 * j);
        const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(qx + 128 * sb));
        acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(qx + 128 * sb + 64));
        const __m512 sv = _mm512_permutexvar_ps(_mm512_add_epi32(step, _mm512_set1_epi32(4 * j)), s16);
        tot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sv, tot);
      }
    }
    out[n] = xs * (_mm512_reduce_add_ps(tot) - 8.0f * _mm512_reduce_add_ps(bias)) + (g_rs ? g_rs[n] : 0.0f);
  }
}

// blocks: per 16 columns and group g, lines j = 0..3: dword c = column c's k 32 g + 8 j + 0..3
// (low nibbles) and + 4..7 (high); then the group's 16 scales. qx in natural order.
template <int kPrefetch>
__attribute__((noinline)) void blocks(const uint8_t* w, const int8_t* qx, const int32_t* qsum, float xs, int64_t N,
                                      float* out) {
  const __m512i mask = _mm512_set1_epi8(15);
  const uint8_t* p = w;
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    __m512 tot = _mm512_setzero_ps();
    for (int64_t g = 0; g < kGroups; ++g) {
      __m512i acc = _mm512_set1_epi32(-8 * qsum[g]);
      const int8_t* x = qx + G * g;
      for (int j = 0; j < 4; ++j) {
        if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
        const __m512i v = _mm512_load_si512(p);
        p += 64;
        const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        int32_t xl, xh;
        std::memcpy(&xl, x + 8 * j, 4);
        std::memcpy(&xh, x + 8 * j + 4, 4);
        acc = _mm512_dpbusd_epi32(acc, lo, _mm512_set1_epi32(xl));
        acc = _mm512_dpbusd_epi32(acc, hi, _mm512_set1_epi32(xh));
      }
      tot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_load_ps(reinterpret_cast<const float*>(p)), tot);
      p += 64;
    }
    _mm512_storeu_ps(out + n0, _mm512_mul_ps(tot, _mm512_set1_ps(xs)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 65536;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  std::vector<uint8_t> q(N * K);  // the weights' unsigned nibbles (q + 8), column n's k at n K + k
  std::vector<float> s(N * kGroups);
  std::vector<int8_t> x(K);
  srand(1);
  for (auto& v : q) v = rand() % 16;
  for (auto& v : s) v = 0.001f * (1 + rand() % 100);
  for (auto& v : x) v = static_cast<int8_t>(rand() % 255 - 127);
  const float xs = 0.02f;
  int32_t* qsum = huge<int32_t>(kGroups);
  for (int64_t g = 0; g < kGroups; ++g)
    for (int64_t k = 0; k < G; ++k) qsum[g] += x[g * G + k];

  // rows
  uint8_t* wr = huge<uint8_t>(N * K / 2);
  float* sr = huge<float>(N * kGroups);
  int8_t* qxr = huge<int8_t>(K);
  for (int64_t sb = 0; sb < K / 128; ++sb)
    for (int b = 0; b < 64; ++b) qxr[128 * sb + b] = x[128 * sb + b], qxr[128 * sb + 64 + b] = x[128 * sb + 64 + b];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t sb = 0; sb < K / 128; ++sb)
      for (int b = 0; b < 64; ++b)
        wr[n * K / 2 + 64 * sb + b] = q[n * K + 128 * sb + b] | (q[n * K + 128 * sb + 64 + b] << 4);
  std::memcpy(sr, s.data(), s.size() * sizeof(float));
  uint8_t* wi = huge<uint8_t>(N * (K / 2 + kGroups * 4));  // rows with the scales inline
  for (int64_t n = 0, off = 0; n < N; ++n)
    for (int64_t c = 0; c < kGroups / 16; ++c, off += 320) {
      std::memcpy(wi + off, wr + n * K / 2 + 256 * c, 256);
      std::memcpy(wi + off + 256, sr + n * kGroups + 16 * c, 64);
    }
  uint8_t* we = huge<uint8_t>(N * (K / 2 + kGroups * 4));  // rows with the scales at each row's end
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(we + n * (K / 2 + kGroups * 4), wr + n * K / 2, K / 2);
    std::memcpy(we + n * (K / 2 + kGroups * 4) + K / 2, sr + n * kGroups, kGroups * 4);
  }
  uint8_t* ws = huge<uint8_t>(N * (K / 2 + kGroups * 4));  // rows with the scales at each row's start
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(ws + n * (K / 2 + kGroups * 4), sr + n * kGroups, kGroups * 4);
    std::memcpy(ws + n * (K / 2 + kGroups * 4) + kGroups * 4, wr + n * K / 2, K / 2);
  }
  // rows assigns lane l of superblock sb (bytes 4 l .. 4 l + 3: k of both nibble halves) to group
  // 4 sb + l / 4, as dot_q4's lanes meet its groups in quantize_q8's order; ref_rows sums the same.
  // blocks
  const size_t block_bytes = static_cast<size_t>(N / 16) * kGroups * 5 * 64;
  uint8_t* wb = huge<uint8_t>(block_bytes);
  for (int64_t n0 = 0, off = 0; n0 < N; n0 += 16)
    for (int64_t g = 0; g < kGroups; ++g) {
      for (int j = 0; j < 4; ++j, off += 64)
        for (int c = 0; c < 16; ++c)
          for (int b = 0; b < 4; ++b) {
            const int64_t k = G * g + 8 * j + b;
            wb[off + 4 * c + b] = q[(n0 + c) * K + k] | (q[(n0 + c) * K + k + 4] << 4);
          }
      for (int c = 0; c < 16; ++c) std::memcpy(wb + off + 4 * c, &s[(n0 + c) * kGroups + g], 4);
      off += 64;
    }
  std::vector<float> ref(N), ref_rows(N), out(N);
  for (int64_t n = 0; n < N; ++n) {
    double a = 0, ar = 0;
    for (int64_t g = 0; g < kGroups; ++g) {
      int64_t d = 0;
      for (int64_t k = G * g; k < G * (g + 1); ++k) d += (q[n * K + k] - 8) * x[k];
      a += s[n * kGroups + g] * static_cast<double>(d);
    }
    for (int64_t sb = 0; sb < K / 128; ++sb)
      for (int l = 0; l < 16; ++l) {
        int64_t d = 0;
        for (int b = 4 * l; b < 4 * l + 4; ++b)
          d += (q[n * K + 128 * sb + b] - 8) * x[128 * sb + b] + (q[n * K + 128 * sb + 64 + b] - 8) * x[128 * sb + 64 + b];
        ar += s[n * kGroups + 4 * sb + l / 4] * static_cast<double>(d);
      }
    ref[n] = static_cast<float>(xs * a);
    ref_rows[n] = static_cast<float>(xs * ar);
  }
  // rows' zero-point term: qx summed over the same lane groups
  int32_t* qsum_rows = huge<int32_t>(kGroups);
  for (int64_t sb = 0; sb < K / 128; ++sb)
    for (int l = 0; l < 16; ++l)
      for (int b = 4 * l; b < 4 * l + 4; ++b) qsum_rows[4 * sb + l / 4] += x[128 * sb + b] + x[128 * sb + 64 + b];
  auto check = [&](const char* name, const std::vector<float>& want) {
    double worst = 0, scale = 0;  // float sums in another order: errors against the outputs' scale
    for (int64_t n = 0; n < N; ++n) worst = std::max(worst, static_cast<double>(std::fabs(out[n] - want[n])));
    for (int64_t n = 0; n < N; ++n) scale = std::max(scale, static_cast<double>(std::fabs(want[n])));
    std::printf("%-8s max error %.2g of outputs up to %.3g%s\n", name, worst, scale, worst < 1e-5 * scale ? "" : "  WRONG");
    return worst < 1e-5 * scale;
  };
  rows<3072>(wr, sr, qxr, qsum_rows, xs, N, out.data());
  bool ok = check("rows", ref_rows);
  rows<0, true>(wi, nullptr, qxr, qsum_rows, xs, N, out.data());
  ok = check("inline", ref_rows) && ok;
  rows<0, false, true>(we, nullptr, qxr, qsum_rows, xs, N, out.data());
  ok = check("row end", ref_rows) && ok;
  rows<0, false, false, true>(ws, nullptr, qxr, qsum_rows, xs, N, out.data());
  ok = check("row start", ref_rows) && ok;
  blocks<0>(wb, x.data(), qsum, xs, N, out.data());
  ok = check("blocks", ref) && ok;
  if (!ok) return 1;

  const double bytes = N * (K / 2 + kGroups * 4.0);
  struct Run { const char* name; double best; } runs[] = {
      {"plain read", 1e9}, {"rows, prefetch 3072 B", 1e9}, {"rows, no prefetch", 1e9},
      {"blocks, no prefetch", 1e9}, {"blocks, prefetch 3072 B", 1e9},
      {"rows inline, no prefetch", 1e9}, {"rows inline, prefetch 3072 B", 1e9},
      {"rows, scales at row end", 1e9}, {"rows, scales at row start", 1e9},
      {"rows, scales at row start, prefetch 3072 B", 1e9}, {"rows, prefetch 3072 B, + row-sum stream", 1e9},
      {"rows, scales at row start, + row-sum stream", 1e9}};
  float* rsum = huge<float>(N);
  volatile int64_t sink = 0;
  for (int r = 0; r < reps; ++r) {  // the variants take turns
    double t = now();
    sink += plain_read(wb, block_bytes);
    runs[0].best = std::min(runs[0].best, now() - t);
    t = now();
    rows<3072>(wr, sr, qxr, qsum_rows, xs, N, out.data());
    runs[1].best = std::min(runs[1].best, now() - t);
    t = now();
    rows<0>(wr, sr, qxr, qsum_rows, xs, N, out.data());
    runs[2].best = std::min(runs[2].best, now() - t);
    t = now();
    blocks<0>(wb, x.data(), qsum, xs, N, out.data());
    runs[3].best = std::min(runs[3].best, now() - t);
    t = now();
    blocks<3072>(wb, x.data(), qsum, xs, N, out.data());
    runs[4].best = std::min(runs[4].best, now() - t);
    t = now();
    rows<0, true>(wi, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[5].best = std::min(runs[5].best, now() - t);
    t = now();
    rows<3072, true>(wi, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[6].best = std::min(runs[6].best, now() - t);
    t = now();
    rows<0, false, true>(we, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[7].best = std::min(runs[7].best, now() - t);
    t = now();
    rows<0, false, false, true>(ws, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[8].best = std::min(runs[8].best, now() - t);
    t = now();
    rows<3072, false, false, true>(ws, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[9].best = std::min(runs[9].best, now() - t);
    g_rs = rsum;
    t = now();
    rows<3072>(wr, sr, qxr, qsum_rows, xs, N, out.data());
    runs[10].best = std::min(runs[10].best, now() - t);
    t = now();
    rows<0, false, false, true>(ws, nullptr, qxr, qsum_rows, xs, N, out.data());
    runs[11].best = std::min(runs[11].best, now() - t);
    g_rs = nullptr;
  }
  std::printf("%lld x %lld int4 g32, %.1f MB of weights and scales, best of %d:\n", static_cast<long long>(N),
              static_cast<long long>(K), bytes / 1e6, reps);
  for (const auto& r : runs) std::printf("  %-42s %5.1f GB/s\n", r.name, bytes / r.best / 1e9);
  return 0;
}
