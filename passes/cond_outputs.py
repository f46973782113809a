"""CondOutputCopyPass: copy a `torch.cond` result that must survive another control-flow op.

executorch 1.5.1 plans the memory of every control-flow body (cond branches, scan/map/while
bodies) in one shared arena, and emits a cond's result as a *move* of its branch's output: the
result keeps pointing into that arena. When a later cond/scan/map runs, its body reuses the
arena and overwrites the earlier result (measured: `a = cond(...); b = cond(...); return a + b`
returns a wrong `a` on the runtime, for float programs with no etfuse pass involved).

This pass inserts a copy right after each cond result that is still used after another
control-flow op starts (a graph output counts as used at the end), so every reader sees a
buffer planned in the enclosing graph. Results that die before the next control-flow op are
left alone (no copy, no cost). Applies to the top graph and every body, nested; the graph
module it is given is never modified.
"""

from __future__ import annotations

__all__ = ["CondOutputCopyPass"]

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
_CLONE = exir_ops.edge.dim_order_ops._clone_dim_order.default


def _clobbered(graph: fx.Graph) -> list[fx.Node]:
    """getitem results of conds that are live when a later control-flow op runs."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    hops = [order[n] for n in graph.nodes if n.op == "call_function" and n.target in _HOPS]
    found = []
    for c in graph.nodes:
        if not (c.op == "call_function" and c.target is torch.ops.higher_order.cond):
            continue
        for g in c.users:
            if g.op != "call_function" or g.target is not operator.getitem:
                continue
            last = max(order[u] for u in g.users) if g.users else order[g]
            if any(order[c] < h <= last for h in hops) and isinstance(g.meta.get("val"), torch.Tensor):
                found.append(g)
    return found


class CondOutputCopyPass(ExportPass):
    """Copies cond results that another control-flow op would overwrite (see module docstring).

    `copied` lists (graph path, getitem node name) for each copy inserted."""

    def __init__(self):
        super().__init__()
        self.copied: list[tuple[str, str]] = []

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.copied = []
        # Always a new module (graph_copy): a module shared with the caller breaks when either is lowered.
        return PassResult(copy_graph_module(graph_module, self._copied_graph), True)

    def _copied_graph(self, gm: fx.GraphModule, path: str) -> fx.Graph:
        todo = set(_clobbered(gm.graph))
        graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
        graph._codegen = copy.deepcopy(gm.graph._codegen)
        env: dict[fx.Node, fx.Node] = {}
        for n in gm.graph.nodes:
            env[n] = graph.node_copy(n, lambda a: env[a])
            if n in todo:
                val = n.meta["val"]
                dim_order = list(val.dim_order()) if hasattr(val, "dim_order") else list(range(val.dim()))
                kept = graph.call_function(_CLONE, (env[n],), {"dim_order": dim_order})
                kept.meta = {**n.meta, "etfuse": {"copied": n.name}}
                env[n] = kept
                self.copied.append((path, n.name))
        return graph
