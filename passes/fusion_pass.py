"""`FusionPass`: an ExportPass that applies fusion rules everywhere in a program.

It rewrites the top graph and every control-flow body (`torch.cond` branches, `while_loop`,
`map` and `scan` bodies, nested), which `subgraph_rewriter.replace_pattern` never reaches. Body
placeholders and HOP operands are never touched: a fusion replaces nodes strictly inside one
graph.

The pass never modifies the graph module it is given, and never hands it back: matches are found
on the caller's graphs first (pure: a rule that fails while matching leaves everything as it
was), then the program is rebuilt once, fusing while copying (`graph_copy`). Even with nothing to
fuse the result is a copy and `modified` is True: executorch's pass manager keeps the caller's
module when a pass says False, and a module shared by two programs is corrupted when either is
lowered. `report` says what was rewritten; with `near_misses=True` it also lists near misses
(a rule whose anchor op matched where its pattern did not, and where it differed).
"""

from __future__ import annotations

from typing import Iterable

import torch.fx as fx
from executorch.exir.pass_base import ExportPass, PassResult

from etfuse.patterns.rule import Rule

from .engine import FusionReport, RuleIndex, apply_matches, find_matches, rebuild_with_matches
from .graph_copy import copy_graph_module, graph_modules

_MAX_SWEEPS = 8


class FusionPass(ExportPass):
    """Rewrite each match of `rules` into its backend op; see `report` for what fused where."""

    def __init__(self, rules: Iterable[Rule], near_misses: bool = False):
        super().__init__()
        self.rules = list(rules)
        self.near_misses = near_misses  # record FusionReport.near_misses (settable on any instance)
        self.index = RuleIndex(self.rules)  # lowers every pattern now: a bad rule fails here
        self.report = FusionReport()

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.report = FusionReport()
        found = {id(gm): find_matches(gm.graph, self.index, path, self.report, self.near_misses)
                 for path, gm in graph_modules(graph_module)}
        return PassResult(copy_graph_module(graph_module, lambda gm, path: self._fused_graph(gm, path, found)), True)

    def _fused_graph(self, gm: fx.GraphModule, path: str, found: dict) -> fx.Graph:
        """A new graph for `gm` with the matches found in it fused."""
        graph = rebuild_with_matches(gm.graph, found[id(gm)], path, self.report)
        for _ in range(_MAX_SWEEPS if self.index.chains and found[id(gm)] else 0):
            more = find_matches(graph, self.index, path, self.report)  # rules that consume fused ops
            if not more:
                break
            apply_matches(graph, more, path, self.report)
        return graph

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[r.name for r in self.rules]})"
