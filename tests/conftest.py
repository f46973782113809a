"""What the test modules share: the kernels loaded, the checks of a C++ `.out` kernel against its
pattern (kernel_checks.py), the fused-vs-eager-vs-runtime check (fusion_helpers.py) and opcheck.

A module that runs `.pte` programs uses `runtime_kernels` (libetfuse_runtime.so); one that calls
`.out` ops in torch uses `eager_kernels` (libetfuse_eager.so too: without it `.out` runs its
Python reference kernel, the pattern), usually for every test:

    pytestmark = pytest.mark.usefixtures("eager_kernels")
"""

from __future__ import annotations

import pytest
import torch

import etfuse.kernels

# `torch.library.opcheck` utilities for `.out` ops: aot_dispatch cannot functionalize the
# `Tensor(a!)` return of a custom op, so every `.out` op is checked without it.
OUT_TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


def load_kernels(eager: bool = False):
    """`etfuse.kernels.load()`: the runtime library; with `eager`, the torch library of the `.out`
    kernels too (built on first use, then cached)."""
    return etfuse.kernels.load(eager=eager)


@pytest.fixture(scope="session")
def runtime_kernels():
    """The ExecuTorch runtime's etfuse kernels, registered (`.pte` programs with etfuse ops run)."""
    return load_kernels()


@pytest.fixture(scope="session")
def eager_kernels():
    """Both libraries: the runtime's kernels and torch's CPU kernels of the `.out` ops."""
    return load_kernels(eager=True)


@pytest.fixture
def kernel_isa(request, eager_kernels):
    """Both libraries' kernels forced onto the ISA the test is parametrized with, and back on "auto"
    after it; a test of an ISA this CPU lacks is skipped:

        @pytest.mark.parametrize("kernel_isa", ["auto", "avx2", "baseline"], indirect=True)
    """
    try:
        etfuse.kernels.set_isa(request.param)
    except ValueError:
        pytest.skip(f"this CPU has no {request.param}")
    if request.param != "auto":  # both libraries run it (a library loaded later would run "auto")
        assert set(etfuse.kernels.current_isa().values()) == {request.param}, etfuse.kernels.current_isa()
    yield request.param
    etfuse.kernels.set_isa("auto")


@pytest.fixture
def kernel_check(eager_kernels):
    """kernel_checks.py (`eager`, `layouts`, `runtime`, `check`, ...) with both libraries loaded."""
    import kernel_checks

    return kernel_checks


@pytest.fixture(scope="session")
def fused_matches_eager(runtime_kernels):
    """fusion_helpers.assert_fused_matches_eager: the fused program, its retrace and its `.pte`
    each give eager's outputs."""
    from fusion_helpers import assert_fused_matches_eager

    return assert_fused_matches_eager


def opcheck_out(op, args, out, kwargs=None) -> None:
    """`torch.library.opcheck` of a `.out` overload (`OUT_TEST_UTILS`) into `out`."""
    torch.library.opcheck(op, tuple(args), {**(kwargs or {}), "out": out}, test_utils=OUT_TEST_UTILS)


@pytest.fixture(scope="session")
def opcheck():
    """`opcheck(op, args, kwargs=None)` for a functional op; `opcheck.out(op, args, out)` for a
    `.out` overload (without aot_dispatch, see OUT_TEST_UTILS)."""

    def check(op, args, kwargs=None, **options):
        torch.library.opcheck(op, tuple(args), kwargs or {}, **options)

    check.out = opcheck_out
    check.OUT_TEST_UTILS = OUT_TEST_UTILS  # for in-place forms: opcheck(op, args, test_utils=...)
    return check
