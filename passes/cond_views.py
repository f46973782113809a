"""CondViewCopyPass: give a view of a control-flow result a real buffer to look at.

Upstream cause (executorch 1.5.1, measured; no etfuse pass involved):
`to_executorch` runs `ReplaceViewCopyWithViewPass`, which turns every `view_copy` whose users
are not the graph output into `memory.view` with a `_ViewSpec` that shares the memory-planned
buffer (mem_id, mem_offset) of its base. The emitter then elides the view entirely
(`_Emitter._emit_view`: static and memory planned -> a tensor pointing at the base's planned
buffer, no instruction). But a `torch.cond` result is never written to its own planned buffer:
the emitter binds it with a `MoveCall` from the taken branch's output (`_Emitter.output`), so at
run time the getitem's EValue is *replaced* by the branch's tensor, and the buffer the elided
view points at is never written. Every reader of the view (`cond -> flatten/reshape/view ->
relu6`, ...) reads stale or uninitialised memory: wrong values, silently. executorch's own
comment on that pass names the same hazard for graph outputs ("the output pointer could be
modified at runtime"), and skips only those. The same `_ViewSpec` on a `scan` result (whose
spec is dynamic-bound) makes `to_executorch` fail with
"Guard shape_dynamism_eq_base failed".

This pass inserts a `_clone_dim_order` copy of the control-flow result before such views, so
the view's base is a tensor written in place by a kernel and planned in the enclosing graph.
Results no view reads, and views that feed only the graph output (not elided upstream), are
left alone. Applies to the top graph and every body, nested; the graph module it is given is
never modified.
"""

from __future__ import annotations

__all__ = ["CondViewCopyPass"]

import copy
import operator
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult
from .graph_copy import copy_graph_module

_HOPS = (torch.ops.higher_order.cond, torch.ops.higher_order.scan, torch.ops.higher_order.map_impl,
         torch.ops.higher_order.while_loop)
_VIEWS = (exir_ops.edge.aten.view_copy.default, torch.ops.aten.view_copy.default)
_CLONE = exir_ops.edge.dim_order_ops._clone_dim_order.default


def _elided_view(n: fx.Node) -> bool:
    """A view_copy that executorch will turn into an elided `memory.view`."""
    return n.op == "call_function" and n.target in _VIEWS and any(u.op != "output" for u in n.users)


def _viewed_results(graph: fx.Graph) -> dict[fx.Node, list[fx.Node]]:
    """getitem results of control-flow ops -> their view_copy users that upstream would elide."""
    found = {}
    for h in graph.nodes:
        if not (h.op == "call_function" and h.target in _HOPS):
            continue
        for g in h.users:
            if g.op != "call_function" or g.target is not operator.getitem:
                continue
            if not isinstance(g.meta.get("val"), torch.Tensor):
                continue
            views = [u for u in g.users if _elided_view(u)]
            if views:
                found[g] = views
    return found


class CondViewCopyPass(ExportPass):
    """Copies control-flow results that a view reads (see module docstring).

    `copied` lists (graph path, getitem node name) for each copy inserted."""

    def __init__(self):
        super().__init__()
        self.copied: list[tuple[str, str]] = []

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.copied = []
        # Always a new module (graph_copy): a module shared with the caller breaks when either is lowered.
        return PassResult(copy_graph_module(graph_module, self._copied_graph), True)

    def _copied_graph(self, gm: fx.GraphModule, path: str) -> fx.Graph:
        todo = _viewed_results(gm.graph)
        redirect = {v: g for g, views in todo.items() for v in views}
        graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
        graph._codegen = copy.deepcopy(gm.graph._codegen)
        env: dict[fx.Node, fx.Node] = {}
        kept: dict[fx.Node, fx.Node] = {}
        for n in gm.graph.nodes:
            if n in redirect:
                base = redirect[n]
                env[n] = graph.node_copy(n, lambda a: kept[a] if a is base else env[a])
            else:
                env[n] = graph.node_copy(n, lambda a: env[a])
            if n in todo:
                val = n.meta["val"]
                dim_order = list(val.dim_order()) if hasattr(val, "dim_order") else list(range(val.dim()))
                clone = graph.call_function(_CLONE, (env[n],), {"dim_order": dim_order})
                clone.meta = {**n.meta, "etfuse": {"copied": n.name}}
                kept[n] = clone
                self.copied.append((path, n.name))
        return graph
