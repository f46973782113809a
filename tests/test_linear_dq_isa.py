"""The dynamically quantized linear (linear_dq: int8 per-token activations x int4 in groups or int8
weights) on every ISA path it has (kernels/csrc/core/linear_dq.h, linear_dq_rows.h,
arch/x86/linear_dq_avx2.h, linear_dq_avx512vnni.h, arch/arm/linear_dq_neon.h):
tests/cpp/linear_dq_check.cpp compares `linear_dq::run` with a scalar reference (torchao's row
quantization, the integer sums exact in int64; bit-exact where every weight scale is 1) and with
the portable code, on x86-64 for the baseline, AVX2 and (where the CPU has it) AVX-512 VNNI
kernels, and cross-compiled for aarch64 under qemu-aarch64 for the portable and the NEON ones (smlal, and sdot on a core with dot products; plain NEON on one without)."""

from __future__ import annotations

import pytest

import isa_checks

CASES = 8441


@pytest.mark.parametrize("target", isa_checks.TARGETS)
def test_linear_dq_matches_the_reference_and_the_portable_code_on_every_isa(target):
    isa_checks.cases_match("linear_dq_check.cpp", CASES, target)
