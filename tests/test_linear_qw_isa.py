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


@pytest.mark.parametrize("target", isa_checks.TARGETS)
def test_linear_qw_matches_the_reference_and_the_portable_code_on_every_isa(target):
    isa_checks.cases_match("linear_qw_check.cpp", CASES, target)
