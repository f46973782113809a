"""The non-GEMM float loops on every ISA path they have (activations, softmax exp, layer and RMS
norms: kernels/csrc/core/{activation,attention,norm}.h and arch/arm/*_neon.h):
tests/cpp/pointwise_check.cpp compares them with libm in double and with the portable scalar code,
on x86-64 for the baseline and AVX2 loops and cross-compiled for aarch64 under qemu-aarch64 for
the portable and the NEON ones."""

from __future__ import annotations

import pytest

import isa_checks


# -O0 too: nothing inlined that need not be (a vector passed between functions of different ISAs)
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_pointwise_loops_match_libm_and_the_portable_code(optimize):
    checked, out = isa_checks.x86_isas_checked("pointwise_check.cpp", optimize)
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2


def test_aarch64_pointwise_loops_match_libm_and_the_portable_code_on_the_neon_paths():
    binary = isa_checks.build("pointwise_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64("neoverse-n1", binary))
    assert out.splitlines() == ["isa baseline: activations, softmax exp, norms, max pool match",
                                "isa neon: activations, softmax exp, norms, max pool match"], out
