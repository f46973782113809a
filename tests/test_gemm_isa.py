"""The float GEMM on every ISA path it has (kernels/csrc/core/gemm.h, arch/arm/gemm_neon.h):
tests/cpp/gemm_check.cpp compares `gemm::run` with a plain triple loop, on x86-64 for the
baseline, AVX2 and (where the CPU has it) AVX-512 tiles, and cross-compiled for aarch64 under
qemu-aarch64 for the portable and the NEON tiles. One aarch64 core is enough: the float GEMM has no
dot-product path (the two cores run the same two ISAs), and the binary is built for Armv8.0 (the
cross compiler's default), so a core without dot products runs the same instructions."""

from __future__ import annotations

import pytest

import isa_checks


# -O0 as well: nothing is inlined there unless it must be, so a vector passed by value between an
# AVX2 function and a helper compiled for the base ISA (a different calling convention) shows
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_gemm_matches_the_reference_on_every_isa_of_this_cpu(optimize):
    checked, out = isa_checks.x86_isas_checked("gemm_check.cpp", optimize)
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2


def test_aarch64_gemm_matches_the_reference_on_the_portable_and_neon_tiles():
    binary = isa_checks.build("gemm_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64("neoverse-n1", binary))
    assert out.splitlines() == ["isa baseline: 19448 cases match", "isa neon: 19448 cases match"], out
