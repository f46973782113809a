"""CondOutputCopyPass: copy a `torch.cond` result that must survive another control-flow op.

Upstream (executorch 1.5.1): it plans the memory of every control-flow body (cond branches, scan/map/while
bodies) in one shared arena, and emits a cond's result as a *move* of its branch's output: the
result keeps pointing into that arena. When a later cond/scan/map runs, its body reuses the
arena and overwrites the earlier result (measured: `a = cond(...); b = cond(...); return a + b`
returns a wrong `a` on the runtime, for float programs with no etfuse pass involved).

This pass inserts a copy right after each cond result that is still used after another
control-flow op starts (a graph output counts as used at the end), so every reader sees a
buffer planned in the enclosing graph. Results that die before the next control-flow op are
left alone (no copy, no cost). Delete this module when executorch plans a cond result in the
enclosing graph (tests/test_compat.py shows the wrong result).
"""

from __future__ import annotations

__all__ = ["CondOutputCopyPass"]

import operator

import torch
import torch.fx as fx

from .result_copy import CONTROL_FLOW_OPS, ResultCopyPass


class CondOutputCopyPass(ResultCopyPass):
    """Copies cond results that another control-flow op would overwrite (see module docstring)."""

    def results_to_copy(self, graph: fx.Graph) -> dict:
        """getitem results of conds that are live when a later control-flow op runs: every later
        reader reads the copy."""
        order = {n: i for i, n in enumerate(graph.nodes)}
        hops = [order[n] for n in graph.nodes if n.op == "call_function" and n.target in CONTROL_FLOW_OPS]
        found = {}
        for c in graph.nodes:
            if not (c.op == "call_function" and c.target is torch.ops.higher_order.cond):
                continue
            for g in c.users:
                if g.op != "call_function" or g.target is not operator.getitem:
                    continue
                last = max(order[u] for u in g.users) if g.users else order[g]
                if any(order[c] < h <= last for h in hops) and isinstance(g.meta.get("val"), torch.Tensor):
                    found[g] = None
        return found
