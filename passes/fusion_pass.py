"""`FusionPass`: an ExportPass that applies fusion rules everywhere in a program.

It rewrites the top graph and every control-flow body (`torch.cond` branches, `while_loop`,
`map` and `scan` bodies, nested), which `subgraph_rewriter.replace_pattern` never reaches. Body
placeholders and HOP operands are never touched: a fusion replaces nodes strictly inside one
graph.

The pass never modifies the graph module it is given. Matches are found on the caller's graphs
(pure), and only graph modules with something to fuse are copied (with the modules above them)
and rewritten; a rule that fails while matching leaves everything as it was, and a graph with
nothing to fuse costs no copy.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch.fx as fx
from executorch.exir.pass_base import ExportPass, PassResult

from etfuse.patterns.rule import Rule

from .engine import FusionReport, RuleIndex, apply_matches, find_matches, rebuild_with_matches

_MAX_SWEEPS = 8


def graph_modules(gm: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    """The top graph module and every nested one (control-flow bodies), top first."""
    return [(name, m) for name, m in gm.named_modules() if isinstance(m, fx.GraphModule)]


class FusionPass(ExportPass):
    """Rewrite each match of `rules` into its backend op; see `report` for what fused where."""

    def __init__(self, rules: Iterable[Rule]):
        super().__init__()
        self.rules = list(rules)
        self.index = RuleIndex(self.rules)  # lowers every pattern now: a bad rule fails here
        self.report = FusionReport()

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.report = FusionReport()
        fused = self._fuse(graph_module, "")
        return PassResult(graph_module, False) if fused is None else PassResult(fused, True)

    def _fuse(self, gm: fx.GraphModule, path: str) -> Optional[fx.GraphModule]:
        """A fused copy of `gm`, or None when neither it nor any body inside it changes."""
        bodies = {}
        for name, child in gm.named_children():
            if isinstance(child, fx.GraphModule):
                fused_child = self._fuse(child, f"{path}.{name}" if path else name)
                if fused_child is not None:
                    bodies[name] = fused_child
        matches = find_matches(gm.graph, self.index, path, self.report)
        if not matches and not bodies:
            return None
        graph = rebuild_with_matches(gm.graph, matches, path, self.report)
        for _ in range(_MAX_SWEEPS if self.index.chains and matches else 0):
            more = find_matches(graph, self.index, path, self.report)  # rules that consume fused ops
            if not more:
                break
            apply_matches(graph, more, path, self.report)
        new_gm = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
        new_gm.meta.update(gm.meta)
        for name, body in bodies.items():
            setattr(new_gm, name, body)
        return new_gm

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[r.name for r in self.rules]})"
