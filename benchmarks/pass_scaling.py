"""Fusion time vs graph size, for what the user calls and for the parts inside it.

    python benchmarks/pass_scaling.py [--max-blocks 8000] [--transform-max-nodes 10000]

Lowers a 4-block program with to_edge once (to_edge itself takes over 20 minutes at 16,000
nodes on a loaded 2-core machine), repeats its first add+relu block to build each size (every
block is the same edge ops with the same meta), and times, side by side in one run on the same
graphs:

* `etfuse.fuse(edge)` end to end (what users call: all of `default_passes()`, constant folding,
  verification of etfuse's nodes, the result program);
* the sum of `default_passes()`' own times (each pass called on the graph module the previous
  one returned), the bare `FloatFusionPass`;
* `edge.transform(default_passes())`, executorch's route (its verifier re-runs every node on fake
  tensors after each call; skipped above `--transform-max-nodes`);
* `torch.fx.subgraph_rewriter.replace_pattern` with the same pattern, the baseline.

Prints a Markdown table, the ratio fuse / sum of passes, and growth exponents (slope of log time
vs log nodes between the smallest and largest size).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time

import torch
import torch.fx as fx
from torch.fx import subgraph_rewriter

from executorch.exir import EdgeProgramManager
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument

import etfuse
from etfuse.backend_ops import ADD_RELU
from etfuse.passes import FloatFusionPass, default_passes
from etfuse.passes.graph_copy import program_with


class Blocks(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, y):
        for _ in range(self.n):
            x = torch.relu(x + y)
        return x


def edge_manager(blocks: int) -> EdgeProgramManager:
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(Blocks(blocks), (torch.randn(8), torch.randn(8)))
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))


def prefix_manager(full: EdgeProgramManager, blocks: int) -> EdgeProgramManager:
    """An edge program of the first `blocks` blocks (built without to_edge's minutes)."""
    ep = full.exported_program()
    gm = repeated(ep.graph_module, blocks)
    last = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    sig = ExportGraphSignature(input_specs=list(ep.graph_signature.input_specs),
                               output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(last.name), None)])
    manager = copy.copy(full)
    manager._edge_programs = {"forward": program_with(ep, gm, signature=sig)}
    return manager


def passes_own_time(gm: fx.GraphModule) -> float:
    """Sum of the default passes' own times, each on the module the previous one returned."""
    total = 0.0
    for p in default_passes():
        t0 = time.perf_counter()
        res = p(gm)
        total += time.perf_counter() - t0
        gm = res.graph_module
    return total


def repeated(gm: fx.GraphModule, blocks: int) -> fx.GraphModule:
    """`blocks` copies of `gm`'s first add+relu block, chained: x = relu(x + y)."""
    x, y = [n for n in gm.graph.nodes if n.op == "placeholder"]
    add, relu = [n for n in gm.graph.nodes if n.op == "call_function"][:2]
    g = fx.Graph()
    new_x, new_y = g.node_copy(x), g.node_copy(y)
    last = new_x
    for _ in range(blocks):
        a = g.node_copy(add, {x: last, y: new_y}.__getitem__)
        last = g.node_copy(relu, {add: a}.__getitem__)
    g.output((last,))
    return fx.GraphModule(gm, g)


def rewriter_pattern_and_replacement():
    """Edge-dialect pattern/replacement graphs for replace_pattern (a traced Python function
    would record ATen ops and match nothing in an edge graph)."""
    pattern = fx.GraphModule(torch.nn.Module(), copy.deepcopy(FloatFusionPass().index.rules[0].edge_pattern().graph))
    g = fx.Graph()
    a, b = g.placeholder("self"), g.placeholder("other")
    g.output(g.call_function(ADD_RELU.backend, (a, b)))
    return pattern, fx.GraphModule(torch.nn.Module(), g)


def op_count(gm: fx.GraphModule) -> int:
    return sum(n.op == "call_function" for n in gm.graph.nodes)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-blocks", type=int, default=8000, help="largest size in add+relu blocks (2 ops each)")
    parser.add_argument("--min-blocks", type=int, default=500)
    parser.add_argument("--transform-max-nodes", type=int, default=10000,
                        help="time edge.transform(default_passes()) up to this size (it is slow)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    full_manager = edge_manager(4)
    print(f"built a 4-block edge program once in {time.perf_counter() - t0:.1f} s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    fusion = FloatFusionPass()
    pattern, replacement = rewriter_pattern_and_replacement()

    sizes, rows = [], []
    blocks = args.max_blocks
    while blocks >= args.min_blocks:
        sizes.append(blocks)
        blocks //= 2
    if 4800 <= args.max_blocks and 4800 not in sizes:
        sizes.append(4800)  # 9,600 nodes: the reference size
    # Once per process, not per call: the rule table is traced to edge (patterns.RULES, one
    # export) on the first fusion. Paid here, timed, so the table times per-call work only.
    t0 = time.perf_counter()
    etfuse.fuse(prefix_manager(full_manager, 1))
    print(f"one-time rule preparation (first fuse of a 1-block program): {time.perf_counter() - t0:.1f} s\n", flush=True)
    for blocks in sorted(sizes):
        manager = prefix_manager(full_manager, blocks)
        gm = manager.exported_program().graph_module
        nodes = len(gm.graph.nodes)

        # interleaved: each repeat times fuse, then the passes, then the bare pass
        t_fuse, t_passes, t_pass = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fused = etfuse.fuse(manager)
            t_fuse.append(time.perf_counter() - t0)
            t_passes.append(passes_own_time(gm))
            t0 = time.perf_counter()
            fusion(gm)
            t_pass.append(time.perf_counter() - t0)
        assert op_count(fused.exported_program().graph_module) == blocks
        t_transform = float("nan")
        if nodes <= args.transform_max_nodes:
            t_transform = timed(lambda: manager.transform(default_passes()), 1)

        fusion(gm)  # check it fused every block
        assert fusion.report.counts() == {"add_relu": blocks}, fusion.report.counts()

        # replace_pattern rewrites in place: one fresh copy per call (copying is not timed).
        copies = [copy.deepcopy(gm) for _ in range(args.repeat + 1)]
        replaced = subgraph_rewriter.replace_pattern(copies.pop(), pattern, replacement)
        assert len(replaced) == blocks, len(replaced)
        t_rewriter = timed(lambda: subgraph_rewriter.replace_pattern(copies.pop(), pattern, replacement), args.repeat)
        med = statistics.median
        rows.append((nodes, med(t_fuse), med(t_passes), med(t_pass), t_transform, t_rewriter))
        print(f"  measured {nodes} nodes", flush=True)

    print("| nodes | etfuse.fuse end to end (s) | sum of default_passes (s) | fuse / passes "
          "| FloatFusionPass (s) | edge.transform(default_passes()) (s) | replace_pattern (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for nodes, tf, tps, tp, tt, tr in rows:
        print(f"| {nodes} | {tf:.3f} | {tps:.3f} | {tf / tps:.2f}x | {tp:.3f} | {tt:.3f} | {tr:.3f} |")

    def exponent(col):
        (n0, *t0), (n1, *t1) = rows[0], rows[-1]
        return math.log(t1[col] / t0[col]) / math.log(n1 / n0)

    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if len(rows) < 2:
        return
    print(f"\ngrowth exponent (time ~ nodes^k), {rows[0][0]} -> {rows[-1][0]} nodes: fuse k = {exponent(0):.2f}, "
          f"passes k = {exponent(1):.2f}, FloatFusionPass k = {exponent(2):.2f}, replace_pattern k = {exponent(4):.2f}")


if __name__ == "__main__":
    main()
