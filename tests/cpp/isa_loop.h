// The ISA loop of the C++ checks: each ISA the library names, on this CPU, checked in turn; and
// their `time` mode's runs on one ISA.
#pragma once

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "core/isa.h"

namespace check_isa_loop {

// Every ISA the library names; a check whose code has no path of its own for some gives fewer
// (then an ISA that falls back to another prints no line of its own).
constexpr std::initializer_list<const char*> kEveryIsa = {"baseline", "avx2", "avx512", "avx512vnni", "neon",
                                                          "neondot"};

// Forces `isa`; false when this CPU cannot run it (set_isa falls back to another).
inline bool use_isa(const char* isa) {
  return etfuse::core::set_isa(isa) && std::strcmp(etfuse::core::current_isa_name(), isa) == 0;
}

// check(isa) -> false on a mismatch (printed by check, which prints its own lines otherwise), on
// each of `isas` this CPU runs, in order; main's status: 0 when all passed and one ran.
template <class Check>
int for_each_isa(std::initializer_list<const char*> isas, Check&& check) {
  int checked = 0;
  for (const char* isa : isas) {
    if (!use_isa(isa)) continue;
    if (!check(isa)) return 1;
    ++checked;
  }
  return checked > 0 ? 0 : 1;
}

// for_each_isa where check(isa) -> the cases that matched (< 0: a mismatch), one
// "isa <name>: <n> cases match" line each.
template <class Check>
int check_every_isa(std::initializer_list<const char*> isas, Check&& check) {
  return for_each_isa(isas, [&](const char* isa) {
    const int cases = check(isa);
    if (cases < 0) return false;
    std::printf("isa %s: %d cases match\n", isa, cases);
    return true;
  });
}

// check_every_isa with the loops the other way round, for a check whose reference is most of its
// cost: cases(on_every_isa) calls on_every_isa(check) once per case (made once), which forces each
// of `isas` this CPU runs in turn and calls check(isa) -> false on a mismatch (printed by check);
// cases returns false at the first mismatch. The same lines and status as check_every_isa.
template <class Cases>
int check_cases_on_every_isa(std::initializer_list<const char*> isas, Cases&& cases) {
  std::vector<const char*> runnable;
  for (const char* isa : isas)
    if (use_isa(isa)) runnable.push_back(isa);
  std::vector<int> matched(runnable.size(), 0);
  const bool ok = cases([&](auto&& check) {
    for (size_t i = 0; i < runnable.size(); ++i) {
      use_isa(runnable[i]);
      if (!check(runnable[i])) return false;
      ++matched[i];
    }
    return true;
  });
  if (!ok || runnable.empty()) return 1;
  for (size_t i = 0; i < runnable.size(); ++i) std::printf("isa %s: %d cases match\n", runnable[i], matched[i]);
  return 0;
}

template <class Check>
int check_every_isa(Check&& check) {
  return check_every_isa(kEveryIsa, check);
}

// The time mode's ISA forced; false, saying so, when this CPU cannot run it.
inline bool use_isa_or_say(const char* isa) {
  if (use_isa(isa)) return true;
  std::printf("no isa %s here\n", isa);
  return false;
}

// `reps` calls of run(), which writes `out` (for counting instructions under qemu), then
// "<label> <sum>": one element of out a call summed, so that no call is optimized away.
template <class Run>
int time_runs(const char* label, int reps, const std::vector<float>& out, Run&& run) {
  double sum = 0.0;
  for (int r = reps; r > 0; --r) {
    run();
    sum += out[static_cast<size_t>(r) % out.size()];
  }
  std::printf("%s %.6g\n", label, sum);
  return 0;
}

}  // namespace check_isa_loop
