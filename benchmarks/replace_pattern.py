"""`etfuse.passes.replace_pattern` vs `torch.fx.subgraph_rewriter.replace_pattern_with_filters`.

    python benchmarks/replace_pattern.py [--sizes 1000,2000,4000,8000,9600,16000] [--repeat 3]
                                         [--torch-max-nodes 16000] [--quant-nodes 16000]

1. The same pattern on the same edge graph, both rewriters on fresh copies (copying not timed),
   interleaved (torch, then etfuse, per repeat), at each size, the results checked equal (printed
   code and replacement count):
   * one op: `relu -> clamp(x, 0)` on pass_scaling's chain of `x = relu(x + y)` blocks;
   * two ops: `add -> relu` into `etfuse::add_relu` on the same graph (pass_scaling's pattern);
   * two anchors (multi-output): `t = x * w; (relu(t), sigmoid(t))` on blocks
     `t = x * w; x = relu(t) + sigmoid(t)`.
   Prints a Markdown table, the ratios, and growth exponents (slope of log time vs log nodes
   between the smallest and the largest size). etfuse defers the module's `recompile()` (the
   regeneration of its Python code, O(nodes), as long as the whole rewrite here) to the first
   call or `gm.code`, as torch's `_LazyGraphModule` does; torch pays it in the call. The table
   also shows etfuse's call followed by `gm.code`, i.e. with that recompile paid.
2. executorch's pattern list (`get_quant_patterns_and_replacements`) through etfuse's
   `replace_patterns` (with executorch's QuantFusionPass steps around it,
   tests/executorch_quant_list.py) vs executorch's `QuantFusionPass` on a FX-quantized (uint8)
   graph of `x = relu(x + y) + z` blocks; the graphs checked equal.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.fx as fx
from torch.fx import subgraph_rewriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from executorch.exir import EdgeCompileConfig, to_edge  # noqa: E402
from executorch.exir.dialects._ops import ops as exir_ops  # noqa: E402

from etfuse.passes import replace_pattern, replace_patterns  # noqa: E402
from pass_scaling import edge_manager, repeated, rewriter_pattern_and_replacement  # noqa: E402

edge = exir_ops.edge


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def ratio(slow: float, fast: float) -> str:
    return "not timed" if math.isnan(slow) else f"{slow / fast:.1f}x"


def graph_of(build) -> fx.GraphModule:
    g = fx.Graph()
    out = build(g)
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g)


def one_op_pattern():
    pattern = graph_of(lambda g: g.call_function(edge.aten.relu.default, (g.placeholder("x"),)))
    replacement = graph_of(lambda g: g.call_function(edge.aten.clamp.default, (g.placeholder("x"), 0.0)))
    return pattern, replacement


def two_anchor_pattern():
    def pattern(g):
        t = g.call_function(edge.aten.mul.Tensor, (g.placeholder("x"), g.placeholder("w")))
        return (g.call_function(edge.aten.relu.default, (t,)), g.call_function(edge.aten.sigmoid.default, (t,)))

    def replacement(g):
        x, w = g.placeholder("x"), g.placeholder("w")
        return (g.call_function(edge.aten.clamp.default, (x, 0.0)), g.call_function(edge.aten.mul.Tensor, (x, w)))

    return graph_of(pattern), graph_of(replacement)


class MultiOutputBlocks(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, w):
        for _ in range(self.n):
            t = x * w
            x = torch.relu(t) + torch.sigmoid(t)
        return x


def repeat_block(gm: fx.GraphModule, blocks: int) -> fx.GraphModule:
    """`blocks` copies of all of `gm`'s ops, chained: each copy's first input is the previous
    copy's (first) output; the other inputs are shared. No to_edge per size (minutes at 16k)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    g = fx.Graph()
    env = {p: g.node_copy(p) for p in placeholders}
    last = env[placeholders[0]]
    for _ in range(blocks):
        local = {**env, placeholders[0]: last}
        for n in ops:
            local[n] = g.node_copy(n, local.__getitem__)
        last = local[out]
    g.output((last,))
    return fx.GraphModule(gm, g)


def timed_pair(gm: fx.GraphModule, pattern, replacement, repeat: int, run_torch: bool):
    """Median seconds of torch, etfuse, and etfuse followed by `gm.code` (the deferred recompile
    paid), on fresh copies, interleaved; checks that both agree."""
    t_torch, t_ours, t_paid = [], [], []
    for i in range(repeat):
        theirs, ours, paid = copy.deepcopy(gm), copy.deepcopy(gm), copy.deepcopy(gm)
        if run_torch:
            t0 = time.perf_counter()
            want = subgraph_rewriter.replace_pattern_with_filters(theirs, pattern, replacement)
            t_torch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = replace_pattern(ours, pattern, replacement)
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        replace_pattern(paid, pattern, replacement)
        paid.code  # noqa: B018  (the deferred recompile)
        t_paid.append(time.perf_counter() - t0)
        if run_torch and i == 0:
            assert len(got) == len(want) and ours.code == theirs.code, "etfuse and torch disagree"
        if run_torch and len(t_torch) and t_torch[-1] > 60:
            run_torch = False  # one slow torch run is enough
    assert got, "the pattern matched nothing"
    med = statistics.median
    return (med(t_torch) if t_torch else float("nan")), med(t_ours), med(t_paid), len(got)


def rewriter_table(args) -> None:
    chain_gm = edge_manager(4).exported_program().graph_module
    multi_ep = to_edge(torch.export.export(MultiOutputBlocks(1), (torch.randn(8), torch.randn(8))),
                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    multi_gm = multi_ep.exported_program().graph_module
    cases = [
        ("one op (relu)", lambda n: repeated(chain_gm, n // 2), one_op_pattern()),
        ("two ops (add -> relu)", lambda n: repeated(chain_gm, n // 2), rewriter_pattern_and_replacement()),
        ("two anchors (mul -> relu, sigmoid)", lambda n: repeat_block(multi_gm, n // 4), two_anchor_pattern()),
    ]
    torch_max = {cases[2][0]: args.torch_max_nodes_two_anchors}
    rows = []
    for label, build, (pattern, replacement) in cases:
        for size in args.sizes:
            gm = build(size)
            nodes = len(gm.graph.nodes)
            t_torch, t_ours, t_paid, count = timed_pair(gm, pattern, replacement, args.repeat,
                                                        nodes <= torch_max.get(label, args.torch_max_nodes))
            rows.append((label, nodes, count, t_torch, t_ours, t_paid))
            print(f"  {label}: {nodes} nodes, {count} replaced: torch {t_torch:.3f} s, etfuse {t_ours:.4f} s "
                  f"({ratio(t_torch, t_ours)}), then gm.code {t_paid:.4f} s ({ratio(t_torch, t_paid)}); {load()}", flush=True)
    print("\n| pattern | nodes | replaced | replace_pattern_with_filters (s) | etfuse replace_pattern (s) | ratio "
          "| etfuse, then `gm.code` (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, nodes, count, tt, to, tb in rows:
        print(f"| {label} | {nodes} | {count} | {tt:.3f} | {to:.4f} | {ratio(tt, to)} | {tb:.4f} | {ratio(tt, tb)} |")
    print()
    for label, *_ in cases:
        mine = [r for r in rows if r[0] == label]
        timed = [r for r in mine if not math.isnan(r[3])]
        k = lambda a, b: math.log(b[0] / a[0]) / math.log(b[1] / a[1])  # noqa: E731
        if len(timed) > 1:
            print(f"growth exponent {label}, torch ({timed[0][1]} -> {timed[-1][1]} nodes): "
                  f"k = {k((timed[0][3], timed[0][1]), (timed[-1][3], timed[-1][1])):.2f}")
        if len(mine) > 1:
            print(f"growth exponent {label}, etfuse ({mine[0][1]} -> {mine[-1][1]} nodes): "
                  f"k = {k((mine[0][4], mine[0][1]), (mine[-1][4], mine[-1][1])):.2f} "
                  f"(then gm.code k = {k((mine[0][5], mine[0][1]), (mine[-1][5], mine[-1][1])):.2f})")


class QuantBlock(torch.nn.Module):
    def forward(self, x, y, z):  # each input used once: FX quantization shares one dequantize among users
        return torch.relu(x + y) + z


def quant_table(args) -> None:
    from executorch.exir.passes._quant_patterns_and_replacements import get_quant_patterns_and_replacements

    from executorch_quant_list import executorch_quant_fusion, fx_quantized_edge, quant_fusion

    block = fx_quantized_edge(QuantBlock(), (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))).exported_program().graph_module
    per_block = sum(n.op == "call_function" for n in block.graph.nodes)
    gm = repeat_block(block, args.quant_nodes // per_block)
    nodes = len(gm.graph.nodes)
    print(f"\nexecutorch's pattern list on a FX-quantized graph of {nodes} nodes "
          f"({per_block} ops a block: q, dq, add, relu, add); {load()}", flush=True)
    theirs = copy.deepcopy(gm)
    t0 = time.perf_counter()
    executorch_quant_fusion(theirs)
    t_torch = time.perf_counter() - t0
    t_ours, t_ours_prebuilt, t_rewrite = [], [], []
    for _ in range(args.repeat):
        ours = copy.deepcopy(gm)
        t0 = time.perf_counter()
        quant_fusion(ours)
        t_ours.append(time.perf_counter() - t0)
        patterns = get_quant_patterns_and_replacements(None)
        prebuilt = copy.deepcopy(gm)
        t0 = time.perf_counter()
        quant_fusion(prebuilt, patterns=patterns)
        t_ours_prebuilt.append(time.perf_counter() - t0)
        rewritten = copy.deepcopy(gm)
        t0 = time.perf_counter()
        replace_patterns(rewritten, patterns, recompile=False)
        t_rewrite.append(time.perf_counter() - t0)
    assert ours.code == theirs.code == prebuilt.code, "etfuse and executorch disagree"
    fused = ours.code.count("quantized_decomposed_add_relu_default(") + ours.code.count("quantized_decomposed_add_default(")
    med = statistics.median
    print(f"| route | seconds | ratio |\n|---|---:|---:|\n"
          f"| executorch QuantFusionPass()(gm) | {t_torch:.2f} | 1x |\n"
          f"| etfuse replace_patterns, list built per call (as executorch does) | {med(t_ours):.3f} | "
          f"{t_torch / med(t_ours):.0f}x |\n"
          f"| etfuse replace_patterns, list built once | {med(t_ours_prebuilt):.3f} | {t_torch / med(t_ours_prebuilt):.0f}x |\n"
          f"| (of which the rewriting alone, without executorch's steps after it) | {med(t_rewrite):.3f} | "
          f"{t_torch / med(t_rewrite):.0f}x |")
    print(f"{fused} quantized adds fused, same graph both ways; {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,4000,8000,9600,16000",
                        type=lambda s: [int(x) for x in s.split(",")], help="graph sizes in nodes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torch-max-nodes", type=int, default=20000, help="time torch up to this size")
    parser.add_argument("--torch-max-nodes-two-anchors", type=int, default=4000,
                        help="time torch on the two-anchor pattern up to this size (it tries every pair of "
                             "candidates: ~11 s at 1,600 nodes, quadratic)")
    parser.add_argument("--quant-nodes", type=int, default=16000, help="size of the quantized graph (0: skip)")
    parser.add_argument("--skip-rewriter", action="store_true")
    args = parser.parse_args()
    print(load())
    if not args.skip_rewriter:
        rewriter_table(args)
    if args.quant_nodes:
        quant_table(args)


if __name__ == "__main__":
    main()
