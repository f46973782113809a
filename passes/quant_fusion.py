"""QuantFusionPass: dequantize -> add [-> relu] -> quantize and dequantize -> embedding into
`quantized_decomposed` ops (rules in patterns/quant_rules.py), int8 and uint8.

One normalisation comes first: a `dequantize_per_tensor` with several users (the FX
`_convert_to_reference_decomposed_fx` form shares one per quantized tensor; PT2E makes one per
use) is split into one per use, so each consumer's chain can fuse on its own. The split happens
on a copy; the caller's graph module is never modified, and if nothing fuses the result is a plain
copy of it.
"""

from __future__ import annotations

import copy

import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import PassResult

from etfuse.patterns.quant_rules import QUANT_RULES

from .fusion_pass import FusionPass
from .graph_copy import copy_graph_module, graph_modules

_DQ = (exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default,)


def _shared_dequantize(gm: fx.GraphModule) -> bool:
    """Does some dequantize node feed more than one use (two users, or one user twice)?"""
    for _, m in graph_modules(gm):
        counts: dict = {}  # user -> {arg node: occurrences}, built once per user
        for t in _DQ:
            for n in m.graph.find_nodes(op="call_function", target=t, sort=False):
                if len(n.users) > 1:
                    return True
                for u in n.users:
                    if u not in counts:
                        c: dict = {}
                        for a in _flat(u):
                            c[a] = c.get(a, 0) + 1
                        counts[u] = c
                    if counts[u].get(n, 0) > 1:
                        return True
    return False


def _flat(u: fx.Node) -> list:
    out = []
    fx.node.map_arg((u.args, u.kwargs), out.append)
    return out


def _uses(u: fx.Node, node: fx.Node) -> int:
    return sum(a is node for a in _flat(u))


def split_dequantize(gm: fx.GraphModule) -> None:
    """Give every use of a shared dequantize node its own copy (in place)."""
    for _, m in graph_modules(gm):
        graph = m.graph
        for t in _DQ:
            for n in list(graph.find_nodes(op="call_function", target=t)):
                if len(n.users) == 1 and next(iter(n.users)).op == "output":
                    continue  # a program output: nothing to fuse, and the output node may be huge
                uses = [(u, k) for u in list(n.users) for k in range(_uses(u, n))]
                for u, _ in uses[1:]:
                    with graph.inserting_after(n):
                        dup = graph.node_copy(n)
                    dup.meta = dict(n.meta)
                    _replace_one_use(u, n, dup)
        m.recompile()


def _replace_one_use(user: fx.Node, old: fx.Node, new: fx.Node) -> None:
    done = [False]

    def swap(a):
        if a is old and not done[0]:
            done[0] = True
            return new
        return a

    user.args = fx.node.map_arg(user.args, swap)
    user.kwargs = fx.node.map_arg(user.kwargs, swap)


class QuantFusionPass(FusionPass):
    """Fuses quantized add / add_relu / add.scalar / embedding chains (see patterns/quant_rules.py)."""

    def __init__(self):
        super().__init__(QUANT_RULES)

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if not _shared_dequantize(graph_module):
            return super().call(graph_module)
        split = copy.deepcopy(graph_module)
        split_dequantize(split)
        result = super().call(split)
        if not self.report.fused:
            return PassResult(copy_graph_module(graph_module), True)
        return result
