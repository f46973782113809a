"""The names a `.pte` calls for etfuse's kernels of ops that executorch's own kernels also serve.

etfuse fuses into the card's `quantized_decomposed` ops (add, add_relu, add.scalar, the
embeddings) and keeps the per-tensor quantize / dequantize at a program's edges. executorch's
stock quantized kernel library registers `quantized_decomposed::add.out`, `embedding_byte.out`,
... in the runtime too, and the runtime aborts on a second registration of one name, so a library
of etfuse's under those names could never be linked into an app beside
`executorch::kernels_quantized` (nor loaded in a Python process that imported
`executorch.kernels.quantized`).

So, as Cadence and Cortex-M do, etfuse's runtime kernels carry etfuse's own names. Each such op
has a *twin*, derived here from its record: `etfuse::quantized_decomposed_<name>` with the same
arguments, whose pattern is the original op (so a twin retraces to it, and from it to ATen) and
whose `.out` variant is what the kernel file registers. A program keeps the original ops while the
user holds it; when it is lowered, `EmitRuntimeNamesPass` (passes/runtime_names.py) swaps each
original for its twin. Stock quantized ops etfuse has no kernel for (quantize_per_channel,
choose_qparams, ...) keep their names and run executorch's kernels.
"""

from __future__ import annotations

import functools
import inspect

from .registry import SHARED_NAMESPACES, BackendOp


def twin_name(op: BackendOp) -> str:
    """`quantized_decomposed_add.scalar` for `quantized_decomposed::add.scalar`."""
    return f"{op.namespace}_{op.name}"


def _calling(op: BackendOp):
    """A pattern with `op`'s parameters that calls `op` (resolved when called: the original may be
    registered after its twin is declared)."""

    def pattern(*args, **kwargs):
        return op.aten(*args, **kwargs)

    pattern.__signature__ = inspect.signature(op.pattern)
    pattern.__name__ = twin_name(op).replace(".", "_")
    return pattern


@functools.lru_cache(maxsize=None)
def runtime_op(op: BackendOp) -> BackendOp:
    """The record whose `.out` kernel serves `op` on the runtime and in eager: its etfuse twin for
    an op of SHARED_NAMESPACES with a kernel, `op` itself otherwise."""
    if op.namespace not in SHARED_NAMESPACES or not op.kernel:
        return op
    schema = twin_name(op) + op.schema[len(op.name):]
    return BackendOp("etfuse", schema, _calling(op), doc=f"`{op.qualname}` under etfuse's name, as a .pte calls it",
                     kernel=op.kernel, triton=op.triton)

