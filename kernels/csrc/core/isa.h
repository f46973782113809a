// The instruction sets the kernels have code for, what this CPU has, and which one runs.
//
// Two ladders, each ISA including the ones below it in its own: x86-64 baseline (SSE2) < AVX2
// (+FMA, F16C) < AVX-512 (F) < AVX-512 VNNI (+BW, VL); aarch64 NEON < NEON with dot products
// (ARMv8.2 sdot/udot). The CPU's features are read once, here only: cpuid on x86-64,
// getauxval(AT_HWCAP) on Linux aarch64, NEON alone on other aarch64 systems. Each kernel family
// picks its functions from selected_isa() in one place (its `*_kernels()` table); a family without
// code for an ISA takes the next one down.
//
// selected_isa() is the best the CPU has, unless set_isa() or ETFUSE_KERNELS_ISA names another the
// CPU has ("baseline" anywhere), so that tests reach every path on one machine (the variable
// caps a name above what the CPU has to the best below it on that ladder).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace etfuse {
namespace core {

enum class Isa : int { kBaseline = 0, kAvx2, kAvx512, kAvx512Vnni, kNeon, kNeonDot };

constexpr const char* kIsaNames[] = {"baseline", "avx2", "avx512", "avx512vnni", "neon", "neondot"};
constexpr int kIsaCount = sizeof(kIsaNames) / sizeof(kIsaNames[0]);

inline const char* isa_name(Isa isa) { return kIsaNames[static_cast<int>(isa)]; }

// The ISA one step down its ladder (kBaseline stays).
constexpr Isa isa_below(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kNeon ? Isa::kBaseline : isa == Isa::kBaseline ? Isa::kBaseline
                                                                                          : static_cast<Isa>(static_cast<int>(isa) - 1);
}

// Whether `have` includes `want` (the same ladder, at or above it; everything includes baseline).
constexpr bool isa_includes(Isa have, Isa want) {
  if (want == Isa::kBaseline) return true;
  const bool want_arm = want >= Isa::kNeon, have_arm = have >= Isa::kNeon;
  return have != Isa::kBaseline && want_arm == have_arm && static_cast<int>(have) >= static_cast<int>(want);
}

struct CpuFeatures {
  bool avx2 = false, avx512 = false, avx512bw = false, avx512vnni = false;  // x86-64
  bool neon = false, neon_dot = false;                                      // aarch64
};

inline CpuFeatures read_cpu_features() {
  CpuFeatures f;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  // F16C (half <-> float) comes with every AVX2 CPU; linear_qw's 4-bit unpacking uses it
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f");
  f.avx512bw = f.avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  f.avx512vnni = f.avx512bw && __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
  f.neon = true;
#if defined(__linux__)
  f.neon_dot = (getauxval(AT_HWCAP) & (1UL << 20)) != 0;  // HWCAP_ASIMDDP
#endif
#endif
  return f;
}

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_cpu_features();
  return f;
}

inline bool cpu_supports(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kBaseline: return true;
    case Isa::kAvx2: return f.avx2;
    case Isa::kAvx512: return f.avx512;
    case Isa::kAvx512Vnni: return f.avx512vnni;
    case Isa::kNeon: return f.neon;
    case Isa::kNeonDot: return f.neon_dot;
  }
  return false;
}

// The best ISA of the CPU on `top`'s ladder at or below `top`.
inline Isa best_at_or_below(Isa top) {
  while (!cpu_supports(top)) top = isa_below(top);
  return top;
}

inline Isa best_isa() { return best_at_or_below(cpu_features().neon ? Isa::kNeonDot : Isa::kAvx512Vnni); }

// "auto" (or null): the best; a known name: that ISA, or where the CPU lacks it and `cap`, the best
// below it on its ladder; false for an unknown name, one of the other architecture, or one the
// CPU lacks without `cap`.
inline bool resolve_isa(const char* name, bool cap, Isa& out) {
  if (name == nullptr || std::strcmp(name, "auto") == 0) {
    out = best_isa();
    return true;
  }
  for (int i = 0; i < kIsaCount; ++i) {
    if (std::strcmp(name, kIsaNames[i]) != 0) continue;
    const Isa want = static_cast<Isa>(i);
    if (want != Isa::kBaseline && (want >= Isa::kNeon) != cpu_features().neon) return false;
    if (!cap && !cpu_supports(want)) return false;
    out = best_at_or_below(want);
    return true;
  }
  return false;
}

// The ISA the kernels run, per library; -1 until first use.
inline std::atomic<int>& isa_state() {
  static std::atomic<int> state{-1};
  return state;
}

inline Isa selected_isa() {
  int v = isa_state().load(std::memory_order_relaxed);
  if (v < 0) {
    Isa isa;
    if (!resolve_isa(std::getenv("ETFUSE_KERNELS_ISA"), true, isa)) isa = best_isa();
    v = static_cast<int>(isa);
    isa_state().store(v, std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

// Whether the running ISA includes `want` (a kernel for `want` may run).
inline bool isa_at_least(Isa want) { return isa_includes(selected_isa(), want); }

// Force an ISA by name: "auto" or one the CPU has. Returns false, changing nothing, for any other
// name. For tests and benchmarks; not meant to race with running kernels.
inline bool set_isa(const char* name) {
  Isa isa;
  if (!resolve_isa(name, false, isa)) return false;
  isa_state().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

inline const char* current_isa_name() { return isa_name(selected_isa()); }

}  // namespace core
}  // namespace etfuse
