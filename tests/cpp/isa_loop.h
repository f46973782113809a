// The ISA loop of the C++ checks: each ISA the library names, on this CPU, checked in turn.
#pragma once

#include <cstdio>
#include <cstring>

#include "core/isa.h"

namespace check_isa_loop {

// Forces `isa`; false when this CPU cannot run it (set_isa falls back to another).
inline bool use_isa(const char* isa) {
  return etfuse::core::set_isa(isa) && std::strcmp(etfuse::core::current_isa_name(), isa) == 0;
}

// check(isa) -> the cases that matched (< 0: a mismatch, printed by check) on every ISA this CPU
// runs, one "isa <name>: <n> cases match" line each; main's status: 0 when all matched and one ran.
template <class Check>
int check_every_isa(Check&& check) {
  const char* isas[] = {"baseline", "avx2", "avx512", "avx512vnni", "neon", "neondot"};
  int checked = 0;
  for (const char* isa : isas) {
    if (!use_isa(isa)) continue;
    const int cases = check(isa);
    if (cases < 0) return 1;
    std::printf("isa %s: %d cases match\n", isa, cases);
    ++checked;
  }
  return checked > 0 ? 0 : 1;
}

}  // namespace check_isa_loop
