"""Triton kernels for the etfuse backend ops on CUDA devices.

The C++ kernels (`etfuse.kernels.load()`) serve the CPU and the ExecuTorch runtime; these
serve CUDA tensors in torch, eager and `torch.compile`:

    etfuse::add_relu, etfuse::linear_relu, etfuse::addmm_relu,
    quantized_decomposed::add, quantized_decomposed::add_relu (int8/uint8, bit-exact with the
    C++ kernels), quantized_decomposed::embedding_byte (float32/float16 out)

`register()` registers them at the CUDA key of each functional op and of its `.out` variant
(see `registration.py` for why there). `register_if_available()` does that only where it can
matter (triton importable and a CUDA device present) and is silent otherwise. Triton is an
optional dependency (`pip install "etfuse[triton]"`): this package imports without it, and
only asking for a kernel (`register()`, `launch`) says it is missing.

Layout: `_jit.py` device code, `launch.py` host launchers (work under Triton's interpreter on
CPU tensors too), `registration.py` torch.library registrations, `ptx.py` ahead-of-time
compilation for a GPU target without a GPU (CI).
"""

from __future__ import annotations

import importlib
from typing import Optional

__all__ = ["TRITON_VERSION", "TritonUnavailableError", "available", "missing_reason", "register",
           "register_if_available", "is_registered", "launch"]

# The version torch 2.13.0's CUDA wheels pin (their Requires-Dist); the `triton` extra pins it too.
TRITON_VERSION = "3.7.1"


class TritonUnavailableError(ImportError):
    """A Triton kernel was asked for, and Triton cannot be imported."""


_REGISTERED: Optional[list] = None


def missing_reason() -> Optional[str]:
    """None when triton imports; else why not, with the fix."""
    try:
        importlib.import_module("triton")
    except ImportError as e:
        return (f"etfuse's CUDA kernels are Triton kernels and triton cannot be imported ({e}); install it with "
                f"`pip install \"etfuse[triton]\"` (triton=={TRITON_VERSION}, the version torch 2.13 pins)")
    return None


def available() -> bool:
    return missing_reason() is None


def _require() -> None:
    reason = missing_reason()
    if reason is not None:
        raise TritonUnavailableError(reason)


def register() -> list[str]:
    """Register the Triton kernels for CUDA (idempotent). Works on machines without a GPU
    (the registrations are then only reached by fake/meta tracing). Returns what was
    registered, as "qualname [dispatch key]". Raises TritonUnavailableError without triton."""
    global _REGISTERED
    if _REGISTERED is None:
        _require()
        import etfuse.backend_ops

        etfuse.backend_ops.install()
        from . import registration

        _REGISTERED = registration.register_all()
    return list(_REGISTERED)


def register_if_available() -> bool:
    """register() where it matters: triton importable and torch sees a CUDA device. Never
    imports triton on a machine without one. Returns whether the kernels are registered."""
    import torch

    if _REGISTERED is None and torch.cuda.is_available() and available():
        register()
    return _REGISTERED is not None


def is_registered() -> bool:
    return _REGISTERED is not None


def __getattr__(name: str):
    # `etfuse.kernels.triton.launch` / `.ptx` import triton: only on first use.
    if name in ("launch", "ptx", "registration"):
        _require()
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
