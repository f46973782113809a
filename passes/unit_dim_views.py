"""UnitDimViewsPass: `unsqueeze_copy` / `squeeze_copy` of static shape, and `permute_copy`
(aten's or etfuse's) that only moves dimensions of size 1, become `view_copy`, so
`to_executorch` makes them views (executorch's ReplaceViewCopyWithViewPass turns every
`view_copy` that is not a program output into `memory.view`, which shares its input's memory).

A permute whose dimensions larger than 1 keep their order moves no element either: a decoding
step's heads transposes, [1, 1, H, D] <-> [1, H, 1, D], are 6 of every llama layer's ops (36
`permute_copy` calls per token on the tiny llama, 4% of its int4 program's time).

The portable runtime runs `unsqueeze_copy` and `squeeze_copy` as full copies, though adding or
removing a dimension of size 1 never moves an element. A conv1d runs as a conv2d on a height-1
image (patterns/gemm_conv_rules.py), between an unsqueeze of its input and weight and a squeeze
of its output: on the wav2letter-style stack those three copies were 11% of the program's time.
`view_copy(x, out.shape)` computes the same tensor for any x in ATen, but the runtime's view
reads x's bytes in the output's dim order: where x's dimensions larger than 1 lie in memory in
another order (a channels-last x under a contiguous unsqueeze), the view reads a
`_clone_dim_order` of x into the contiguous order (the portable unsqueeze_copy, a memcpy, is as
wrong there as a bare view). Symbolic shapes keep their op.

Copies of a placeholder (a weight, a program input) are views too. They once stayed copies:
before spatial convs ran as the GEMM over phase planes (core/conv2d.h run_phase_gemm), the conv
read a weight in place from the program's constants as much slower as the copy had cost. Since,
on the same AVX-512 Xeon, the wav2letter-style stack (its conv1d weights 100 MB, each copied per
call: 12% of the program) went from 110 to 97 ms with the weights read in place
(benchmarks/models.py --models wav2letter --isolated; XNNPACK 68 ms: 1.55x -> 1.42x). A
placeholder is viewed only where every op that reads it is such a copy: a mutable buffer (a KV
cache) is also read by the op that updates it, which `to_executorch` may turn into an in-place
update, and a view taken before it would then see the new values.

Only the top-level graph is visited, after the fusion pass (the rules see the graph as export
made it, and the conv1d rules' own unsqueezes exist by then).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from executorch.exir.dim_order_utils import is_contiguous_dim_order
from executorch.exir.pass_base import ExportPass
from torch.fx.passes.infra.pass_base import PassResult

from etfuse.backend_ops import PERMUTE_COPY

from .engine import _aten
from .graph_copy import copy_graph_module, unchanged

# unsqueeze_copy / squeeze_copy -> the view_copy of the same dialect
_UNIT_DIM_COPIES = {
    op: aten.view_copy.default
    for aten in (exir_ops.edge.aten, torch.ops.aten)
    for op in (aten.unsqueeze_copy.default, aten.squeeze_copy.dims, aten.squeeze_copy.dim, aten.squeeze_copy.default)
}


_CLONES = {True: exir_ops.edge.dim_order_ops._clone_dim_order.default,  # by dialect (edge or not)
           False: torch.ops.dim_order_ops._clone_dim_order.default}

_PERMUTES = {torch.ops.aten.permute_copy.default, PERMUTE_COPY.aten}  # by their ATen overloads


def _view_target(node: fx.Node):
    """The view_copy that replaces this node's copy, or None where it is no unit-dim copy."""
    if node.op != "call_function":
        return None
    if node.target in _UNIT_DIM_COPIES:
        return _UNIT_DIM_COPIES[node.target]
    if _aten(node.target) in _PERMUTES and _moves_only_unit_dims(node):
        edge = isinstance(node.target, EdgeOpOverload)  # etfuse's backend op too
        return exir_ops.edge.aten.view_copy.default if edge else torch.ops.aten.view_copy.default
    return None


def _moves_only_unit_dims(node: fx.Node) -> bool:
    """permute(x, dims) keeps the order of x's dimensions larger than 1 (static sizes)."""
    x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims")
    if not isinstance(x, torch.Tensor) or not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in x.shape):
        return False
    moved = [d % x.dim() for d in dims if x.shape[d] != 1]
    return moved == sorted(moved)


def _view_sizes(node: fx.Node):
    """The view_copy's sizes (the copy's static output shape), or None where the copy stays."""
    source = node.args[0]
    if not isinstance(source, fx.Node):
        return None
    if source.op == "placeholder" and not all(_view_target(user) for user in source.users):
        return None  # a buffer an op also reads: it may be updated in place (module docstring)
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    if not isinstance(source.meta.get("val"), torch.Tensor):
        return None
    if not _same_element_order(source.meta["val"], val) and not is_contiguous_dim_order(val):
        return None  # no contiguous copy of the source to view either (UnitDimViewsPass.call)
    return list(val.shape)


def _same_element_order(source, out) -> bool:
    """The runtime's view shares the source's memory and reads it in the output's dim order, so
    the dimensions larger than 1 must lie in memory in the same order in both (these copies keep
    those dimensions' relative order: the i-th of the source is the i-th of the output). A
    channels-last source unsqueezed into a contiguous output is no view of it."""
    def memory_order(t):
        sized = [d for d in range(t.dim()) if t.shape[d] != 1]
        return [sized.index(d) for d in t.dim_order() if t.shape[d] != 1]

    return memory_order(source) == memory_order(out)


def _contiguous_copy(graph: fx.Graph, node: fx.Node, source: fx.Node) -> fx.Node:
    """`_clone_dim_order(source)` into the contiguous dim order, before node: what the view of a
    source in another memory order reads. The portable runtime's unsqueeze_copy / squeeze_copy
    copy the bytes as they lie (memcpy), so the copy left in place would be as wrong as the view."""
    val = source.meta["val"]
    clone = _CLONES[isinstance(node.target, EdgeOpOverload)]
    with graph.inserting_before(node):
        copy = graph.call_function(clone, (source,), {"dim_order": list(range(val.dim()))})
    copy.meta = {"val": val.clone(memory_format=torch.contiguous_format), "etfuse": {"pass": "UnitDimViewsPass"}}
    return copy


class UnitDimViewsPass(ExportPass):
    """Static-shape `unsqueeze_copy` / `squeeze_copy` / unit-dim `permute_copy` -> `view_copy`
    (module docstring)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        # the first node rewritten is the first that qualifies in the graph as given
        if not any(_view_target(n) is not None and _view_sizes(n) is not None for n in graph_module.graph.nodes):
            return unchanged(graph_module, copy_modified=False)
        result = copy_graph_module(graph_module)
        changed = False
        for node in result.graph.nodes:
            view = _view_target(node)
            shape = _view_sizes(node) if view is not None else None
            if shape is None:
                continue
            source = node.args[0]
            if not _same_element_order(source.meta["val"], node.meta["val"]):
                source = _contiguous_copy(result.graph, node, source)
            node.target = view
            node.args = (source, shape)
            node.kwargs = {}
            node.meta["etfuse"] = {"pass": "UnitDimViewsPass"}  # etfuse.fuse verifies the nodes it wrote
            changed = True
        if changed:
            result.recompile()
        return PassResult(result, changed)
