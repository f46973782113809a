"""The weight-only linear (linear_qw: int4 in groups, int8 per channel or in groups) on every ISA
path it has (kernels/csrc/core/linear_qw.h, linear_qw_dot.h, arch/arm/linear_qw_neon.h):
tests/cpp/linear_qw_check.cpp compares `linear_qw::run` with the pattern's math in double and with
the portable code, on x86-64 for the baseline, AVX2 and (where the CPU has it) AVX-512 kernels, and
cross-compiled for aarch64 under qemu-aarch64 for the portable and the NEON ones (both NEON ISAs on
a core with dot products, plain NEON on one without)."""

from __future__ import annotations

import pytest

import isa_checks

CASES = 4380


# -O0 too: nothing inlined that need not be (a vector passed between functions of different ISAs)
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_linear_qw_matches_the_reference_and_the_portable_code(optimize):
    checked, out = isa_checks.x86_isas_checked("linear_qw_check.cpp", optimize)
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2
    assert f"isa avx2: {CASES} cases match" in out.splitlines(), out


@pytest.mark.parametrize("cpu, isas", [("neoverse-n1", ["neon", "neondot"]), ("cortex-a53", ["neon"])])
def test_aarch64_linear_qw_matches_the_reference_and_the_portable_code_on_the_neon_paths(cpu, isas):
    binary = isa_checks.build("linear_qw_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64(cpu, binary))
    assert out.splitlines() == [f"isa {isa}: {CASES} cases match" for isa in ["baseline", *isas]], out
