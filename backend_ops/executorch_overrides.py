"""`install()`: the one place etfuse changes registrations that executorch owns.

Importing `etfuse.backend_ops` registers etfuse's own ops (the `etfuse` namespace) and nothing
else. What replaces or shadows executorch's registrations happens here, once per process:

* the `quantized_decomposed` ops (quantized_ops.py): their `.out` schemas, etfuse's dtype-generic
  patterns as the CompositeImplicitAutograd kernels of add / add_relu / add.scalar (executorch
  binds uint8-only ones), etfuse's embedding_byte kernel and `.out` fake kernel, and a stand-in
  module for `executorch.kernels.quantized` (the real one would abort the process now);
* the `executorch_prim` ops (prims.py): symbolic-safe CompositeImplicitAutograd kernels, so a
  program holding prims retraces without specialising.

Callers: `etfuse.fuse`, `etfuse.passes.FusionPass` and `SymIntToPrimsPass` (their `__init__`),
`etfuse.report.rule_ops`, and `etfuse.kernels.load()`. Call it yourself before using the
quantized ops' handles (`QUANTIZED_ADD.aten`, ...) directly. Idempotent and thread-safe.
"""

from __future__ import annotations

import threading

from . import prims, quantized_ops

__all__ = ["install", "installed"]

_LOCK = threading.Lock()
_INSTALLED = False


def install() -> None:
    """Make etfuse's registrations the ones executorch's ops dispatch to (see module docstring)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        quantized_ops.install()
        prims.ensure_registered()
        _INSTALLED = True


def installed() -> bool:
    return _INSTALLED
