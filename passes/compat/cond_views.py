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
left alone. Delete this module when executorch writes control-flow results to their planned
buffer or stops eliding views of them (tests/test_compat.py shows the wrong result).
"""

from __future__ import annotations

__all__ = ["CondViewCopyPass"]

import operator

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops

from .result_copy import CONTROL_FLOW_OPS, ResultCopyPass

_VIEWS = (exir_ops.edge.aten.view_copy.default, torch.ops.aten.view_copy.default)


def _elided_view(n: fx.Node) -> bool:
    """A view_copy that executorch will turn into an elided `memory.view`."""
    return n.op == "call_function" and n.target in _VIEWS and any(u.op != "output" for u in n.users)


class CondViewCopyPass(ResultCopyPass):
    """Copies control-flow results that a view reads (see module docstring)."""

    def results_to_copy(self, graph: fx.Graph) -> dict:
        """getitem results of control-flow ops -> their view_copy readers that upstream would elide."""
        found = {}
        for h in graph.nodes:
            if not (h.op == "call_function" and h.target in CONTROL_FLOW_OPS):
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
