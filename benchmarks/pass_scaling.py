"""Fusion-pass time vs graph size: etfuse's FusionPass vs torch.fx.subgraph_rewriter.replace_pattern.

    python benchmarks/pass_scaling.py [--max-blocks 4800]

Builds one edge program of N add+relu blocks (to_edge itself takes about a minute at 9,600
nodes, so it runs once), cuts prefixes of it for the smaller sizes, and times both rewriters on
fresh copies of the same graphs, side by side in one run. Prints a Markdown table and the growth
exponent (slope of log time vs log nodes between the smallest and largest size).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time

import torch
import torch.fx as fx
from torch.fx import subgraph_rewriter

from etfuse.backend_ops import ADD_RELU
from etfuse.passes import FloatFusionPass


class Blocks(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, y):
        for _ in range(self.n):
            x = torch.relu(x + y)
        return x


def edge_graph_module(blocks: int) -> fx.GraphModule:
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(Blocks(blocks), (torch.randn(8), torch.randn(8)))
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program().graph_module


def prefix(gm: fx.GraphModule, blocks: int) -> fx.GraphModule:
    """The first `blocks` add+relu blocks of `gm` as a new graph module."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    last = None
    ops = 0
    for n in gm.graph.nodes:
        if n.op == "output":
            break
        if n.op == "call_function":
            if ops == 2 * blocks:
                break
            ops += 1
        env[n] = last = g.node_copy(n, env.__getitem__)
    g.output((last,))
    return fx.GraphModule(gm, g)


def rewriter_pattern_and_replacement():
    """Edge-dialect pattern/replacement graphs for replace_pattern (a traced Python function
    would record ATen ops and match nothing in an edge graph)."""
    pattern = fx.GraphModule(torch.nn.Module(), copy.deepcopy(FloatFusionPass().index.rules[0].lower().graph))
    g = fx.Graph()
    a, b = g.placeholder("self"), g.placeholder("other")
    g.output(g.call_function(ADD_RELU.backend, (a, b)))
    return pattern, fx.GraphModule(torch.nn.Module(), g)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-blocks", type=int, default=4800, help="largest size in add+relu blocks (2 ops each)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    full = edge_graph_module(args.max_blocks)
    print(f"built the {2 * args.max_blocks}-op edge graph once in {time.perf_counter() - t0:.1f} s\n")
    fusion = FloatFusionPass()
    pattern, replacement = rewriter_pattern_and_replacement()

    sizes, rows = [], []
    blocks = args.max_blocks
    while blocks >= 150:
        sizes.append(blocks)
        blocks //= 2
    for blocks in sorted(sizes):
        gm = prefix(full, blocks)
        nodes = len(gm.graph.nodes)

        fusion(gm)  # warm-up, and check it fused every block
        assert fusion.report.counts() == {"add_relu": blocks}, fusion.report.counts()
        t_etfuse = timed(lambda: fusion(gm), args.repeat)

        # replace_pattern rewrites in place: one fresh copy per call (copying is not timed).
        copies = [copy.deepcopy(gm) for _ in range(args.repeat + 1)]
        replaced = subgraph_rewriter.replace_pattern(copies.pop(), pattern, replacement)
        assert len(replaced) == blocks, len(replaced)
        t_rewriter = timed(lambda: subgraph_rewriter.replace_pattern(copies.pop(), pattern, replacement), args.repeat)
        rows.append((nodes, t_etfuse, t_rewriter))

    print("| nodes | etfuse FusionPass (s) | replace_pattern (s) | speed-up |")
    print("|---:|---:|---:|---:|")
    for nodes, te, tr in rows:
        print(f"| {nodes} | {te:.4f} | {tr:.4f} | {tr / te:.1f}x |")

    def exponent(col):
        (n0, *t0), (n1, *t1) = rows[0], rows[-1]
        return math.log(t1[col] / t0[col]) / math.log(n1 / n0)

    print(f"\ngrowth exponent (time ~ nodes^k): etfuse k = {exponent(0):.2f}, replace_pattern k = {exponent(1):.2f}")


if __name__ == "__main__":
    main()
