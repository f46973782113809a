// The quantized weights of linear_qw_check.cpp and linear_dq_check.cpp (one setup for the two
// kernels that read linear_qw's weights): random int8 or int4 values as linear_qw holds them
// (pack4), scales and zero points per group, bias and residual, and the core's Args over them.
#pragma once

#include <cmath>
#include <vector>

#include "check_random.h"
#include "core/linear_qw.h"

namespace quantized_weight {

namespace qw = etfuse::core::linear_qw;

// run's column blocks as a parallel_for would cut them, one after the other
const auto blocks = [](int64_t begin, int64_t end, int64_t grain, auto&& fn) {
  for (int64_t b = begin; b < end; b += grain) fn(b, b + grain < end ? b + grain : end);
};

// One linear: x [M, K] @ the weight [N, K].T in `groups` groups a row.
struct Case {
  int bits;
  int64_t M, N, K, groups;
  bool zp, bias, residual;
};

struct Problem {
  std::vector<float> x, scales, bias, residual;
  std::vector<uint8_t> w;  // as linear_qw reads it: int8, or pack4's nibbles
  std::vector<int8_t> q, zp;
  qw::Args args(const Case& c, float* out) const {
    qw::Args a;
    a.M = c.M, a.N = c.N, a.K = c.K;
    a.A = x.data(), a.a_rs = c.K;
    a.W = w.data(), a.w_rs = c.bits == 4 ? c.K / 2 : c.K, a.bits = c.bits;
    a.scales = scales.data(), a.groups = c.groups;
    a.zp = c.zp ? zp.data() : nullptr;
    a.bias = c.bias ? bias.data() : nullptr;
    a.residual = c.residual ? residual.data() : nullptr, a.r_rs = c.N;
    a.C = out, a.c_rs = c.N;
    return a;
  }
};

// p's weight (q, and w from it), scales (all 1 where `unit`), zero points (zrange values centred
// on 0), bias and residual, drawn in that order; x is the caller's.
inline void make_weight(const Case& c, int zrange, bool unit, Problem& p) {
  using check_random::next_bits;
  using check_random::next_value;
  p.q.resize(static_cast<size_t>(c.N * c.K));
  for (auto& v : p.q) v = static_cast<int8_t>(c.bits == 4 ? static_cast<int>(next_bits() % 16) - 8
                                                           : static_cast<int>(next_bits() % 256) - 128);
  if (c.bits == 4) {
    p.w.resize(p.q.size() / 2);
    qw::pack4(p.q.data(), c.N, c.K, p.w.data());
  } else {
    p.w.resize(p.q.size());
    for (size_t i = 0; i < p.q.size(); ++i) p.w[i] = static_cast<uint8_t>(p.q[i]);
  }
  p.scales.resize(static_cast<size_t>(c.N * c.groups));
  for (auto& v : p.scales) v = unit ? 1.0f : 0.01f + 0.04f * std::fabs(next_value());
  p.zp.resize(p.scales.size());
  for (auto& v : p.zp) v = static_cast<int8_t>(static_cast<int>(next_bits() % zrange) - zrange / 2);
  p.bias.resize(static_cast<size_t>(c.N));
  for (auto& v : p.bias) v = next_value();
  p.residual.resize(static_cast<size_t>(c.M * c.N));
  for (auto& v : p.residual) v = next_value();
}

}  // namespace quantized_weight
