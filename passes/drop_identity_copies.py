"""DropIdentityCopiesPass: copies that nothing can tell from their source are dropped.

Export leaves a `_clone_dim_order` wherever eager made a copy: `nn.Dropout` in eval mode,
`x.clone()`, `.contiguous()` of a contiguous tensor. On the runtime each one is a full pass over
its tensor (DS-CNN: two 8,000-float copies, 2% of the program's time). Where the copy keeps the
dim order and nobody can observe that it is a copy, its users read the source instead:

* the source is the result of an operator (not a program input, whose memory the caller owns,
  and not a control-flow result: CondOutputCopyPass and CondViewCopyPass decide about those);
* the copy is not a program output;
* every user of the copy is an operator, and no operator in the graph mutates a tensor (a
  mutable buffer's update, etfuse's in-place cache update): in a functional graph a tensor and
  its copy hold the same values for as long as either is read;
* no user of the copy is a functional op that `to_executorch` may switch to its in-place form
  (`update_cache`, passes/inplace_updates.py): that one writes into the copy, and without it into
  the source, which other nodes or the program's outputs still read.

Only the top-level graph is visited. It runs after the fusion pass, so the rules see the graph as
export made it, and before the control-flow copy passes, whose copies it never sees.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass
from torch.fx.passes.infra.pass_base import PassResult

from .graph_copy import copy_graph_module, unchanged
from .inplace_updates import inplace_overrides

_COPIES = (exir_ops.edge.dim_order_ops._clone_dim_order.default, torch.ops.dim_order_ops._clone_dim_order.default)


def _schema(node: fx.Node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _mutates(node: fx.Node) -> bool:
    schema = _schema(node)
    return schema is not None and schema.is_mutable


def _identity_copy(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _COPIES or len(node.args) != 1:
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node) or _schema(src) is None or src.target in _COPIES:
        return False
    src_val, val = src.meta.get("val"), node.meta.get("val")
    if not isinstance(src_val, torch.Tensor) or not isinstance(val, torch.Tensor) or src_val.dtype != val.dtype:
        return False
    order = node.kwargs.get("dim_order")
    if order is not None and list(order) != list(src_val.dim_order()):
        return False
    return all(_schema(user) is not None for user in node.users)


class DropIdentityCopiesPass(ExportPass):
    """Users of an unobservable `_clone_dim_order` read its source instead (module docstring)."""

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if not _droppable(graph_module.graph):
            return unchanged(graph_module, copy_modified=False)
        result = copy_graph_module(graph_module)
        graph = result.graph
        for n in _droppable(graph):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
        result.recompile()
        return PassResult(result, True)


def _droppable(graph: fx.Graph) -> list[fx.Node]:
    """The identity copies of `graph` to drop (none where some op mutates its input)."""
    if any(_mutates(n) for n in graph.nodes):
        return []
    outputs: set = set()
    for n in graph.nodes:
        if n.op == "output":
            fx.node.map_arg(n.args, outputs.add)
    in_place_later = set(inplace_overrides())
    return [n for n in graph.nodes
            if _identity_copy(n) and n not in outputs and not any(u.target in in_place_later for u in n.users)]
