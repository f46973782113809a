"""The float depthwise and direct convs on every ISA path they have (kernels/csrc/core/conv2d.h,
arch/arm/depthwise_neon.h): tests/cpp/conv2d_check.cpp compares `conv2d::run` with a plain loop,
on x86-64 for the baseline and AVX2 (AVX-512 where the CPU has it) paths and cross-compiled for
aarch64 under qemu-aarch64 for the portable and the NEON ones, on a core with and one without
dot products."""

from __future__ import annotations

import pytest

import isa_checks

CASES = 703  # conv2d_check's cases per ISA
ROWS = 4  # of them, the depthwise convs that detail::depthwise_rows takes on NEON
BLOCKS = 262  # and detail::depthwise_blocks_neon


# -O0 too: nothing inlined that need not be (a vector passed between functions of different ISAs)
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_convs_match_the_reference_on_every_isa_of_this_cpu(optimize):
    checked, out = isa_checks.x86_isas_checked("conv2d_check.cpp", optimize)
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2


# -O3 only under qemu (suite time): the -O0 build guards an x86 hazard (vectors passed between
# functions of different target ISAs), which the x86 test above covers
@pytest.mark.parametrize("cpu", ["neoverse-n1", "cortex-a53"])
def test_aarch64_convs_match_the_reference_on_the_portable_and_neon_paths(cpu):
    binary = isa_checks.build("conv2d_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64(cpu, binary))
    assert out.splitlines() == [f"isa baseline: {CASES} cases match, 0 on depthwise rows, 0 on depthwise blocks",
                                f"isa neon: {CASES} cases match, {ROWS} on depthwise rows, {BLOCKS} on depthwise blocks"], out
