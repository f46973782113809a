"""The int8 conv and linear paths on every ISA they have (ops/quantized_gemm.h; core/int8_gemm.h,
core/int8_pointwise.h, arch/x86/quantized_gemm_avx2.h, arch/arm/int8_neon.h): tests/cpp/int8_check.cpp
compares each with a plain integer reference under the same requantization, bit-exact: on x86-64 the
float path on the baseline and AVX2 (and the VNNI kernel where the CPU has it), and cross-compiled
for aarch64 under qemu-aarch64 the float path and the int8 kernels, sdot on a core with dot
products (and its smlal fallback forced there), smlal on one without. Depthwise convs likewise
(core/int8_depthwise.h): the float path on every ISA, arch/arm/int8_depthwise_neon.h on NEON."""

from __future__ import annotations

import pytest

import isa_checks

FLOAT_CASES, KERNEL_CASES, DW_CASES = 2252, 1552, 1000


@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_int8_paths_match_the_integer_reference(optimize):
    out = isa_checks.run([str(isa_checks.build("int8_check.cpp", "g++", optimize=optimize))])
    lines = out.splitlines()
    assert f"isa baseline path float: {FLOAT_CASES} cases match" in lines, out
    assert f"isa avx2 path float: {FLOAT_CASES} cases match" in lines, out  # the CI machines have AVX2
    assert f"isa baseline path dw-float: {DW_CASES} cases match" in lines, out
    assert f"isa avx2 path dw-float: {DW_CASES} cases match" in lines, out


# each ISA the core has: the float path and its int8 kernel (smlal on NEON, sdot on NEON with dot
# products; set_isa("neon") forces the smlal one on the core with dot products); the depthwise
# float path everywhere, its NEON kernel on both NEON ISAs (baseline: none)
@pytest.mark.parametrize("cpu, isas", [("neoverse-n1", ["neon", "neondot"]), ("cortex-a53", ["neon"])])
def test_aarch64_int8_paths_match_the_integer_reference(cpu, isas):
    binary = isa_checks.build("int8_check.cpp", "aarch64-linux-gnu-g++", "-static")
    out = isa_checks.run(isa_checks.qemu_aarch64(cpu, binary))
    kernel = {"neon": "neon-mlal", "neondot": "neon-dot"}
    assert out.splitlines() == [
        f"isa baseline path float: {FLOAT_CASES} cases match",
        f"isa baseline path dw-float: {DW_CASES} cases match",
        *(line for isa in isas for line in (f"isa {isa} path float: {FLOAT_CASES} cases match",
                                            f"isa {isa} path {kernel[isa]}: {KERNEL_CASES} cases match",
                                            f"isa {isa} path dw-float: {DW_CASES} cases match",
                                            f"isa {isa} path dw-neon: {DW_CASES} cases match")),
    ], out
