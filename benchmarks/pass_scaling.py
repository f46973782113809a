"""Fusion time vs graph size, for what the user calls and for each step inside it.

    python benchmarks/pass_scaling.py [--max-blocks 8000] [--min-blocks 500] [--repeat 3] [--transform-max-nodes 10000]

Lowers a 4-block program with to_edge once (to_edge itself takes over 20 minutes at 16,000
nodes on a loaded 2-core machine), repeats its first add+relu block to build each size (every
block is the same edge ops with the same meta), and times, side by side in one run on the same
graphs, from 1,000 to 16,000 nodes by default:

* `etfuse.fuse(edge)` end to end (what users call: all of `default_passes()`, verification of
  etfuse's nodes, the result program), wall and CPU time; and `etfuse.fuse(edge.exported_program())`;
* each step inside `fuse` (`fuse(..., step_times=...)`): every pass of `default_passes()` (their
  graph copies included), the copy carrying the constants' values, program construction,
  `verify_written_nodes`, the setup and the result manager;
* the sum of `default_passes()`' own times (each pass called on the graph module the previous
  one returned), the bare `FloatFusionPass`;
* `edge.transform(default_passes())`, executorch's route (its verifier re-runs every node on fake
  tensors after each call; skipped above `--transform-max-nodes`);
* `torch.fx.subgraph_rewriter.replace_pattern` with the same pattern, the baseline.

Each time is the minimum over `--repeat` runs (the machine may be shared), each run after a full
garbage collection (so one size does not pay for the previous one's garbage). Prints Markdown
tables and growth exponents: the slope of log time vs log nodes between the smallest and
largest size (1.0 is linear).
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import os
import time

import torch
import torch.fx as fx
from torch.fx import subgraph_rewriter

from executorch.exir import EdgeCompileConfig, EdgeProgramManager
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument

import etfuse
from etfuse.backend_ops import ADD_RELU
from etfuse.passes import FloatFusionPass, default_passes
from etfuse.passes.pipeline import fuse as fuse_with_steps
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
    """`to_edge` with its default configuration: `fuse` verifies the nodes it wrote, as for users."""
    from executorch.exir import to_edge

    ep = torch.export.export(Blocks(blocks), (torch.randn(8), torch.randn(8)))
    return to_edge(ep, compile_config=EdgeCompileConfig())


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
    """The minimum wall time of `repeat` calls, each after a full garbage collection."""
    return min(_timed_once(fn)[0] for _ in range(repeat))


def _timed_once(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of one call of `fn`, after a full garbage collection."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def exponent(n0: int, t0: float, n1: int, t1: float) -> float:
    """k in time ~ nodes^k between two sizes."""
    return math.log(t1 / t0) / math.log(n1 / n0) if t0 > 0 and t1 > 0 else float("nan")


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

    sizes = []
    blocks = args.max_blocks
    while blocks >= args.min_blocks:
        sizes.append(blocks)
        blocks //= 2
    # Once per process, not per call: the rule table is traced to edge (patterns.RULES, one
    # export) on the first fusion. Paid here, timed, so the tables time per-call work only.
    t0 = time.perf_counter()
    etfuse.fuse(prefix_manager(full_manager, 1))
    print(f"one-time rule preparation (first fuse of a 1-block program): {time.perf_counter() - t0:.1f} s\n", flush=True)
    rows, steps_by_size = [], []
    for blocks in sorted(sizes):
        manager = prefix_manager(full_manager, blocks)
        gm = manager.exported_program().graph_module
        nodes = len(gm.graph.nodes)

        # interleaved: each repeat times fuse (with its steps), fuse of the program, the passes, the bare pass
        t_fuse, c_fuse, t_fuse_ep, t_passes, t_pass, steps = [], [], [], [], [], {}
        for _ in range(args.repeat):
            times: dict = {}
            wall, cpu = _timed_once(lambda: fuse_with_steps(manager, step_times=times))
            t_fuse.append(wall)
            c_fuse.append(cpu)
            for step, t in times.items():
                steps[step] = min(steps.get(step, math.inf), t)
            t_fuse_ep.append(_timed_once(lambda: etfuse.fuse(manager.exported_program()))[0])
            gc.collect()
            t_passes.append(passes_own_time(gm))
            t_pass.append(_timed_once(lambda: fusion(gm))[0])
        fused = etfuse.fuse(manager)
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
        rows.append((nodes, min(t_fuse), min(c_fuse), min(t_fuse_ep), min(t_passes), min(t_pass), t_transform, t_rewriter))
        steps_by_size.append(steps)
        print(f"  measured {nodes} nodes (load average {os.getloadavg()[0]:.1f})", flush=True)

    columns = ["etfuse.fuse(edge) (s)", "its CPU time (s)", "etfuse.fuse(exported program) (s)",
               "sum of default_passes (s)", "FloatFusionPass (s)", "edge.transform(default_passes()) (s)",
               "replace_pattern (s)"]
    print("\n| nodes | " + " | ".join(columns) + " |")
    print("|---:" * (len(columns) + 1) + "|")
    for nodes, *ts in rows:
        print(f"| {nodes} | " + " | ".join(f"{t:.3f}" for t in ts) + " |")
    if len(rows) < 2:
        return
    (n0, *first), (n1, *last) = rows[0], rows[-1]
    print(f"| k ({n0} -> {n1}) | " + " | ".join(f"{exponent(n0, a, n1, b):.2f}" for a, b in zip(first, last)) + " |")

    print(f"\nInside etfuse.fuse(edge), per step (s; minimum over {args.repeat} runs):\n")
    names = list(steps_by_size[-1])
    print("| step | " + " | ".join(str(n) for n, *_ in rows) + f" | share at {n1} | k ({n0} -> {n1}) |")
    print("|---" + "|---:" * (len(rows) + 2) + "|")
    total_last = sum(steps_by_size[-1].values())
    for name in names:
        ts = [s.get(name, float("nan")) for s in steps_by_size]
        print(f"| {name} | " + " | ".join(f"{t:.3f}" for t in ts)
              + f" | {ts[-1] / total_last:.0%} | {exponent(n0, ts[0], n1, ts[-1]):.2f} |")
    sums = [sum(s.values()) for s in steps_by_size]
    print("| sum of steps | " + " | ".join(f"{t:.3f}" for t in sums) + f" | 100% | {exponent(n0, sums[0], n1, sums[-1]):.2f} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
