"""One `dequantize_per_tensor` per use, so each quantized chain can fuse on its own.

The FX `_convert_to_reference_decomposed_fx` form shares one dequantize per quantized tensor;
PT2E makes one per use. A quantized rule's pattern holds the dequantize as an interior node,
which may have no users outside the match, so a shared one blocks every chain that reads it.
`FusionPass` splits on a copy, only when it runs quantized rules and some dequantize is shared.
"""

from __future__ import annotations

import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops

from .graph_copy import graph_modules

__all__ = ["DEQUANTIZE_OPS", "has_shared_dequantize", "split_dequantize"]

DEQUANTIZE_OPS = (exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default,)


def has_shared_dequantize(gm: fx.GraphModule) -> bool:
    """Does some dequantize node feed more than one use (two users, or one user twice)?"""
    for _, m in graph_modules(gm):
        counts: dict = {}  # user -> {arg node: occurrences}, built once per user
        for t in DEQUANTIZE_OPS:
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
        for t in DEQUANTIZE_OPS:
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
