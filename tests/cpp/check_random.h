// The checks' deterministic inputs: one linear congruential generator, the same on every
// compiler and architecture, so a mismatch reproduces everywhere.
#pragma once

#include <cstdint>

namespace check_random {

inline uint32_t state = 12345;

// 24 random bits.
inline uint32_t next_bits() {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

// Uniform in [-1, 1], in steps of 1 / 1000.
inline float next_value() { return static_cast<float>(next_bits() % 2001) / 1000.0f - 1.0f; }

}  // namespace check_random
