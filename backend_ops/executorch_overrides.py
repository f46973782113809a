"""`install()`: the one place etfuse changes registrations that executorch owns.

Importing `etfuse.backend_ops` registers etfuse's own ops (the `etfuse` namespace) and nothing
else. What replaces or shadows executorch's registrations happens here, once per process:

* the `quantized_decomposed` ops (quantized_ops.py): etfuse's dtype-generic patterns as the
  CompositeImplicitAutograd kernels of add / add_relu / add.scalar (executorch binds uint8-only
  ones), etfuse's embedding kernels and `.out` fake kernels, and their etfuse twins
  (runtime_names.py); then executorch's stock quantized library (`executorch.kernels.quantized`),
  whose `.out` schemas lower the quantized ops etfuse does not fuse, and whose runtime kernels run
  them (it registers no name etfuse's kernels do);
* executorch's functional -> `.out` table (`exir.operator.convert`) maps the fused quantized ops
  executorch has no `.out` variant for (add_relu, add.scalar) to their etfuse twins' `.out`, so
  a program fused with `QuantFusionPass` alone (executorch's own pass lists, `transform` then
  executorch's `to_executorch`) still lowers, and calls etfuse's kernels for them; ops with a stock
  `.out` keep it there (etfuse's routes call the twins, passes/runtime_names.py);
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
        _lower_fused_ops_without_stock_out_to_twins()
        prims.ensure_registered()
        _INSTALLED = True


def _lower_fused_ops_without_stock_out_to_twins() -> None:
    from executorch.exir.operator import convert

    from . import CATALOG, registry, runtime_op

    for op in CATALOG:
        twin = runtime_op(op)
        if twin is not op and registry._existing_schema(op.namespace, op.out_name) is None:
            convert._func_to_out_variant_map[op.aten] = twin.aten_out


def installed() -> bool:
    return _INSTALLED
