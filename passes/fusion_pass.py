"""`FusionPass`: an ExportPass that applies fusion rules everywhere in a program.

By default it runs the one rule table (`etfuse.patterns.RULES`: every rule family together; which
rule wins is the rules' own data, see passes/engine.py). `FloatFusionPass`, `GemmConvFusionPass`,
`BesideXnnpackFusionPass` and `QuantFusionPass` (quant_fusion.py) are the same pass over a part of it.

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

import copy
from typing import Iterable, Optional

import torch.fx as fx
from executorch.exir.pass_base import ExportPass, PassResult

from etfuse.backend_ops import FLOAT_OPS, install
from etfuse.patterns import (
    ATTENTION_RULES, CACHE_RULES, EMBEDDING_RULES, ROPE_RULES, FLOAT_RULES, GEMM_CONV_RULES, NORM_RULES, RULES, WEIGHT_ONLY_RULES, QuantRule, Rule,
)

from .engine import FusionReport, RuleIndex, apply_matches, find_matches, rebuild_with_matches
from .graph_copy import copy_graph_module, graph_modules, unchanged
from .split_dequantize import has_shared_dequantize, split_dequantize

_MAX_SWEEPS = 8


class FusionPass(ExportPass):
    """Rewrite each match of `rules` (default: all of etfuse's) into its backend op; see `report`
    for what fused where."""

    def __init__(self, rules: Optional[Iterable[Rule]] = None, near_misses: bool = False,
                 node_value_dict: Optional[dict] = None):
        super().__init__()
        install()  # the quantized ops' handles and kernels are etfuse's from here on
        self.rules = list(RULES if rules is None else rules)
        self.near_misses = near_misses  # record FusionReport.near_misses (settable on any instance)
        # {placeholder name: tensor}: weight values rules may look at (`Match.constant`), for
        # graphs whose weights are placeholders; executorch's `_get_node_value_dict(program)` makes one
        self.node_value_dict = node_value_dict
        self.index = RuleIndex(self.rules)  # traces every pattern now: a bad rule fails here
        self.report = FusionReport()
        # Quantized rules hold a dequantize inside their pattern: a shared one must be split per use.
        self._splits = any(isinstance(r, QuantRule) for r in self.rules)

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if self._splits and has_shared_dequantize(graph_module):
            split = copy.deepcopy(graph_module)
            split_dequantize(split)
            result, matched = self._fuse(split)
            if any(isinstance(r, QuantRule) for r in matched):
                return result
            if not self.report.fused:
                return unchanged(graph_module)
            # the split served no quantized fusion: fuse the caller's graph as it is
        return self._fuse(graph_module)[0]

    def _fuse(self, graph_module: fx.GraphModule) -> tuple[PassResult, set]:
        """The fused copy, and the rules that matched in the first sweep."""
        self.report = FusionReport()
        found = {id(gm): find_matches(gm.graph, self.index, path, self.report, self.near_misses, self.node_value_dict)
                 for path, gm in graph_modules(graph_module)}
        matched = {m.rule for ms in found.values() for m in ms}
        if not matched:  # the rebuild would copy every graph as it is: a copy, or to etfuse.fuse the module itself
            return unchanged(graph_module), matched
        return PassResult(copy_graph_module(graph_module, lambda gm, path: self._fused_graph(gm, path, found)), True), matched

    def _fused_graph(self, gm: fx.GraphModule, path: str, found: dict) -> fx.Graph:
        """A new graph for `gm` with the matches found in it fused."""
        graph = rebuild_with_matches(gm.graph, found[id(gm)], path, self.report)
        for _ in range(_MAX_SWEEPS if self.index.chains and found[id(gm)] else 0):
            more = find_matches(graph, self.index, path, self.report, known_values=self.node_value_dict)  # rules that consume fused ops
            if not more:
                break
            apply_matches(graph, more, path, self.report)
        return graph

    def __repr__(self) -> str:
        return f"{type(self).__name__}({[r.name for r in self.rules]})"


class FloatFusionPass(FusionPass):
    """The rules whose backend op is one of the elementwise-epilogue ops of `FLOAT_OPS`
    (backend_ops/float_ops.py: add_relu, addmm_relu, linear_relu and the broadcasting mul / add):
    `FLOAT_RULES` and the GEMM rules that produce linear_relu. docs/passes.md lists the rules."""

    def __init__(self, near_misses: bool = False):
        super().__init__([*FLOAT_RULES, *(r for r in GEMM_CONV_RULES if r.replacement in FLOAT_OPS)], near_misses)


class GemmConvFusionPass(FusionPass):
    """`GEMM_CONV_RULES` (patterns/gemm_conv_rules.py): a convolution or linear with its bias,
    batch norm, activation and weight transpose as one GEMM/conv op. docs/passes.md lists the rules."""

    def __init__(self, near_misses: bool = False):
        super().__init__(GEMM_CONV_RULES, near_misses)


class BesideXnnpackFusionPass(FusionPass):
    """The rules for what the XNNPACK delegate leaves to the portable runtime: attention (XNNPACK
    takes its bmm and softmax apart, not the whole), RMS norm, quantized embeddings and weight-only
    quantized linears (it runs no `dequantize_affine` weight-only linear), KV-cache writes and rotary
    embeddings (it leaves their squeezes out, which splits the graph into more delegate calls). Run before
    `to_backend(XnnpackPartitioner())` (`passes_beside_xnnpack()`), so the partitioner takes the
    linears and convolutions and etfuse the rest."""

    def __init__(self, near_misses: bool = False):
        super().__init__([*ATTENTION_RULES, *NORM_RULES, *EMBEDDING_RULES, *WEIGHT_ONLY_RULES, *CACHE_RULES, *ROPE_RULES],
                         near_misses)

