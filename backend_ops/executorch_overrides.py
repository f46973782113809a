"""`install()`: the one place etfuse changes registrations that executorch owns.

Importing `etfuse.backend_ops` registers etfuse's own ops (the `etfuse` namespace) and nothing
else. What replaces or shadows executorch's registrations happens here, once per process:

* the `quantized_decomposed` ops (quantized_ops.py): etfuse's dtype-generic patterns as the
  CompositeImplicitAutograd kernels of add / add_relu / add.scalar (executorch binds uint8-only
  ones), etfuse's embedding kernels and `.out` fake kernels, and their etfuse twins
  (runtime_names.py); then executorch's stock quantized library (`executorch.kernels.quantized`),
  whose `.out` schemas lower the quantized ops etfuse does not fuse, and whose runtime kernels run
  them (it registers no name etfuse's kernels do);
* the backend-dialect handles of the fused quantized ops (what etfuse's and executorch's
  QuantFusionPass write) lower to their etfuse twins' `.out` (a handle keeps its own out variant),
  so a program fused by `QuantFusionPass` alone and lowered by executorch's own `to_executorch`
  calls etfuse's kernels too (executorch has no add_relu.out, and its add.out aborts on a
  broadcast); the edge-dialect handles that unfused programs hold keep executorch's kernels;
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
        import executorch.kernels.quantized  # noqa: F401
        _lower_fused_quantized_ops_to_twins()
        prims.ensure_registered()
        _INSTALLED = True


def _lower_fused_quantized_ops_to_twins() -> None:
    from . import CATALOG, runtime_op

    for op in CATALOG:
        if runtime_op(op) is not op:
            op.backend._out_variant = runtime_op(op).aten_out


def installed() -> bool:
    return _INSTALLED
