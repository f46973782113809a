"""EmitRuntimeNamesPass: ops whose kernels etfuse and executorch both have are emitted under
etfuse's names.

Each `quantized_decomposed` op that etfuse has a kernel for (add, add_relu, add.scalar, the
embeddings, per-tensor quantize / dequantize, per-channel dequantize) becomes its etfuse twin
(`etfuse::quantized_decomposed_add`, ...; backend_ops/runtime_names.py): same arguments, same
result, a name executorch's stock quantized kernels do not register. A `.pte` lowered after this
pass runs on etfuse's kernels, whether or not the app also links `executorch::kernels_quantized`.

It is a lowering step: `etfuse.fuse(...).to_executorch()` runs it on its copy of the program (the
program the user holds keeps the card's `quantized_decomposed` ops), and it closes
`default_passes()`, so `ExecutorchBackendConfig(passes=default_passes())` emits the same names
(`edge.transform(default_passes())` then holds the twins, which retrace to the same ATen).
Every graph, control-flow bodies too.
"""

from __future__ import annotations

import functools

import torch.fx as fx
from executorch.exir.pass_base import ExportPass
from torch.fx.passes.infra.pass_base import PassResult

from .graph_copy import copy_graph_module, graph_modules


@functools.lru_cache(maxsize=None)
def _twins() -> dict:
    """{the original op's OpOverload: the twin as a backend-dialect handle}."""
    from etfuse.backend_ops import CATALOG, install, runtime_op

    install()
    return {op.aten: runtime_op(op).backend for op in CATALOG if runtime_op(op) is not op}


def _original(target):
    """The OpOverload behind an edge / backend op handle (or the target itself)."""
    return getattr(target, "_op", target)


class EmitRuntimeNamesPass(ExportPass):
    """Each op with an etfuse twin is called as its twin (module docstring)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        twins = _twins()
        result = copy_graph_module(graph_module)  # a graph of its own, even when nothing changes
        modified = False
        for _, m in graph_modules(result):
            renamed = False
            for n in m.graph.nodes:
                if n.op == "call_function" and _original(n.target) in twins:
                    n.target = twins[_original(n.target)]
                    renamed = True
            if renamed:
                m.recompile()
            modified |= renamed
        return PassResult(result, modified)
