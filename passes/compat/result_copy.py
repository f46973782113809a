"""The skeleton of the passes that copy a control-flow result into a buffer of its own.

executorch 1.5.1 binds a control-flow op's result to its body's output buffer instead of
writing it to a buffer planned in the enclosing graph; cond_outputs.py and cond_views.py each
work around one consequence. Both insert a `_clone_dim_order` right after the result and make
some of its readers read the copy; they differ only in which results and which readers
(`results_to_copy`). The graph module given is never modified (and, where there is nothing to
copy, handed back only to a caller that owns it, `graph_copy.unchanged`); top graph and every
body, nested.
"""

from __future__ import annotations

__all__ = ["CONTROL_FLOW_OPS", "ResultCopyPass"]

import copy
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.dim_order_utils import is_channel_last_dim_order, is_contiguous_dim_order
from executorch.exir.pass_base import ExportPass, PassResult

from ..graph_copy import copy_graph_module, graph_modules, unchanged

CONTROL_FLOW_OPS = (torch.ops.higher_order.cond, torch.ops.higher_order.scan, torch.ops.higher_order.map_impl,
                    torch.ops.higher_order.while_loop)
_CLONE = exir_ops.edge.dim_order_ops._clone_dim_order.default


class ResultCopyPass(ExportPass):
    """Copies the results `results_to_copy` picks. `copied` lists (graph path, getitem node name)
    for each copy inserted."""

    def __init__(self):
        super().__init__()
        self.copied: list[tuple[str, str]] = []

    def results_to_copy(self, graph: fx.Graph) -> dict[fx.Node, Optional[list[fx.Node]]]:
        """{result (a getitem node): the readers that read the copy, or None for every later reader}."""
        raise NotImplementedError

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.copied = []
        if not any(self.results_to_copy(m.graph) for _, m in graph_modules(graph_module)):
            return unchanged(graph_module)
        # Always a new module (graph_copy): a module shared with the caller breaks when either is lowered.
        return PassResult(copy_graph_module(graph_module, self._copied_graph), True)

    def _copied_graph(self, gm: fx.GraphModule, path: str) -> fx.Graph:
        todo = self.results_to_copy(gm.graph)
        redirect = {r: g for g, readers in todo.items() if readers is not None for r in readers}
        graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
        graph._codegen = copy.deepcopy(gm.graph._codegen)
        env: dict[fx.Node, fx.Node] = {}
        kept: dict[fx.Node, fx.Node] = {}
        for n in gm.graph.nodes:
            base = redirect.get(n)
            env[n] = graph.node_copy(n, lambda a: kept[a] if a is base else env[a])
            if n in todo:
                clone = graph.call_function(_CLONE, (env[n],), {"dim_order": _dim_order(n.meta["val"])})
                clone.meta = {**n.meta, "etfuse": {"copied": n.name}}
                kept[n] = clone
                if todo[n] is None:
                    env[n] = clone
                self.copied.append((path, n.name))
        return graph


def _dim_order(val) -> Optional[list[int]]:
    """The copy's dim order: the result's, where executorch has a memory format for it (contiguous,
    channels-last); otherwise None, which keeps the result's strides (preserve_format). A
    transposed result's [1, 0] has none: executorch's clone would raise on it while lowering."""
    mappable = is_contiguous_dim_order(val) or is_channel_last_dim_order(val)
    return list(val.dim_order()) if mappable else None
