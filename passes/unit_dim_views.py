"""UnitDimViewsPass: `unsqueeze_copy` / `squeeze_copy` of static shape become `view_copy`, so
`to_executorch` makes them views (executorch's ReplaceViewCopyWithViewPass turns every
`view_copy` that is not a program output into `memory.view`, which shares its input's memory).

The portable runtime runs `unsqueeze_copy` and `squeeze_copy` as full copies, though adding or
removing a dimension of size 1 never moves an element. A conv1d runs as a conv2d on a height-1
image (patterns/gemm_conv_rules.py), between an unsqueeze of its input and weight and a squeeze
of its output: on the wav2letter-style stack those three copies were 11% of the program's time.
`view_copy(x, out.shape)` computes the same tensor for any x (a unit dimension can be added or
dropped whatever the strides), so the rewrite changes no value; symbolic shapes keep their op.

Copies of a placeholder (a weight, a program input) stay copies. Made a view, conv1d's weight is
read in place from the program's constants, and wav2letter's convs (a 2000 x 8000 weight read
as 12 strided rows at a time) got slower by as much as the copy had cost (ETDump, AVX-512 Xeon:
conv2d_act 81 -> 101 ms with the weight copies 10.5 ms gone): the copy streams the weight into
cache right before the conv reads it. The activations' unsqueezes and squeezes are views (the
copies: 88.0 + 11.7 + 0.7 ms -> 86.0 + 11.6 ms, the weight copies left).

Only the top-level graph is visited, after the fusion pass (the rules see the graph as export
made it, and the conv1d rules' own unsqueezes exist by then).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass
from torch.fx.passes.infra.pass_base import PassResult

from .graph_copy import copy_graph_module

# unsqueeze_copy / squeeze_copy -> the view_copy of the same dialect
_UNIT_DIM_COPIES = {
    op: aten.view_copy.default
    for aten in (exir_ops.edge.aten, torch.ops.aten)
    for op in (aten.unsqueeze_copy.default, aten.squeeze_copy.dims, aten.squeeze_copy.dim, aten.squeeze_copy.default)
}


def _view_sizes(node: fx.Node):
    """The view_copy's sizes (the copy's static output shape), or None where the copy stays."""
    if not isinstance(node.args[0], fx.Node) or node.args[0].op == "placeholder":
        return None  # a weight's copy stays (module docstring)
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    return list(val.shape)


class UnitDimViewsPass(ExportPass):
    """Static-shape `unsqueeze_copy` / `squeeze_copy` -> `view_copy` (module docstring)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        result = copy_graph_module(graph_module)
        changed = False
        for node in result.graph.nodes:
            view = _UNIT_DIM_COPIES.get(node.target) if node.op == "call_function" else None
            shape = _view_sizes(node) if view is not None else None
            if shape is None:
                continue
            node.target = view
            node.args = (node.args[0], shape)
            node.kwargs = {}
            node.meta["etfuse"] = {"pass": "UnitDimViewsPass"}  # etfuse.fuse verifies the nodes it wrote
            changed = True
        if changed:
            result.recompile()
        return PassResult(result, changed)
