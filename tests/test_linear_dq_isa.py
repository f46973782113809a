"""The dynamically quantized linear (linear_dq: int8 per-token activations x int4 in groups or int8
weights) on every ISA path it has (kernels/csrc/core/linear_dq.h, linear_dq_rows.h,
arch/x86/linear_dq_avx2.h, arch/arm/linear_dq_neon.h): tests/cpp/linear_dq_check.cpp compares
`linear_dq::run` with a scalar reference (torchao's row quantization, the integer sums exact in
int64; bit-exact where every weight scale is 1) and with the portable code, on x86-64 for the
baseline and AVX2 kernels, and cross-compiled for aarch64 under qemu-aarch64 for the portable and
the NEON ones (smlal, and sdot on a core with dot products; plain NEON on one without)."""

from __future__ import annotations

import pytest

import isa_checks

CASES = 6973


# -O0 too: nothing inlined that need not be (a vector passed between functions of different ISAs)
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_linear_dq_matches_the_reference_and_the_portable_code(optimize):
    checked, out = isa_checks.x86_isas_checked("linear_dq_check.cpp", optimize)
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2
    assert f"isa avx2: {CASES} cases match" in out.splitlines(), out


@pytest.mark.parametrize("cpu, isas", [("neoverse-n1", ["neon", "neondot"]), ("cortex-a53", ["neon"])])
def test_aarch64_linear_dq_matches_the_reference_and_the_portable_code_on_the_neon_paths(cpu, isas):
    binary = isa_checks.build("linear_dq_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64(cpu, binary))
    assert out.splitlines() == [f"isa {isa}: {CASES} cases match" for isa in ["baseline", *isas]], out
