"""Export -> edge -> fuse -> .pte -> run on the ExecuTorch runtime, compared with eager.

Shared by `etfuse demo`, `etfuse fuse` and `etfuse.report.collect`: one function does the whole flow, stage by stage
(each stage can report its time through `progress`), and returns what a person wants to know
about it (ops before/after, what fused where, error; optionally the stock program's error and
both latencies, bounded by a time budget).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import statistics
import time
from typing import Callable, ContextManager, Optional, Sequence

import torch
from executorch.exir import EdgeCompileConfig

from etfuse.passes import (
    Fused, FusionPass, correctness_passes, default_passes, fuse, graph_modules, to_edge,
)

Progress = Callable[[str], ContextManager]


def _no_progress(stage: str) -> ContextManager:
    return contextlib.nullcontext()


@dataclasses.dataclass
class ComparisonResult:
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    fused: list[Fused]
    declined: list
    max_abs_error: float
    pte: bytes
    max_rel_error: float = 0.0  # max abs error / max |eager output|
    near_misses: Optional[list] = None  # with near_misses=True
    # Only with compare=True / bench_runs > 0:
    stock_max_abs_error: Optional[float] = None
    latency_unfused_ms: Optional[float] = None
    latency_fused_ms: Optional[float] = None
    bench_runs: int = 0  # runs timed per program (fewer than asked when the time budget ran out)
    stock_pte: Optional[bytes] = None  # with compare=True: the stock program, for profiling

    def markdown(self, title: str) -> str:
        lines = [f"# {title}", "", "## Ops", "", "| op | before | after |", "|---|---:|---:|"]
        for op in sorted(set(self.ops_before) | set(self.ops_after)):
            lines.append(f"| `{op}` | {self.ops_before.get(op, 0)} | {self.ops_after.get(op, 0)} |")
        lines += ["", "## Fusions", "", "| rule | graph | new node | replaced |", "|---|---|---|---|"]
        for f in self.fused:
            lines.append(f"| {f.rule} | {f.graph or 'forward'} | `{f.node}` | {', '.join(f.replaced)} |")
        if self.declined:
            lines += ["", "## Not fused", "", "| rule | graph | node | why |", "|---|---|---|---|"]
            for d in self.declined:
                lines.append(f"| {d.rule} | {d.graph or 'forward'} | `{d.node}` | {d.reason} |")
        lines += ["", "## ExecuTorch runtime vs eager PyTorch", "",
                  f"- max abs error, etfuse-fused: {self.max_abs_error:.3g}"]
        if self.stock_max_abs_error is not None:
            lines.append(f"- max abs error, stock ops: {self.stock_max_abs_error:.3g}")
        if self.latency_fused_ms is not None:
            if self.latency_unfused_ms is not None:
                lines.append(f"- latency, stock ops: {self.latency_unfused_ms:.3f} ms (median of {self.bench_runs} runs)")
                lines.append(f"- latency, etfuse-fused: {self.latency_fused_ms:.3f} ms "
                             f"({self.latency_unfused_ms / max(self.latency_fused_ms, 1e-9):.2f}x)")
            else:
                lines.append(f"- latency, etfuse-fused: {self.latency_fused_ms:.3f} ms (median of {self.bench_runs} runs)")
        lines.append("")
        return "\n".join(lines)


def op_histogram(gm: torch.fx.GraphModule) -> dict[str, int]:
    """How many of each op the program has, bodies of control flow included."""
    counts: collections.Counter = collections.Counter()
    for _, m in graph_modules(gm):
        for n in m.graph.nodes:
            if n.op == "call_function":
                target = getattr(n.target, "_op", n.target)
                counts[str(target) if isinstance(target, torch._ops.OpOverload) else getattr(n.target, "__name__", str(n.target))] += 1
    return dict(counts)


def _median_ms(method, inputs, runs: int, seconds: float) -> tuple[float, int]:
    """Median latency of up to `runs` executions (after one warm-up), stopping when `seconds` are spent."""
    method.execute_unchecked(inputs)  # warm up
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < runs:
        t0 = time.perf_counter()
        method.execute_unchecked(inputs)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 > deadline:
            break
    return 1e3 * statistics.median(times), len(times)


def _flat(values) -> list:
    return [v for v in torch.utils._pytree.tree_leaves(values)]


def _max_abs_error(got, expected) -> float:
    got, expected = _flat(got), _flat(expected)
    if len(got) != len(expected):
        return float("inf")
    error = 0.0
    for o, e in zip(got, expected):
        if isinstance(e, torch.Tensor):
            if not isinstance(o, torch.Tensor) or tuple(o.shape) != tuple(e.shape):
                return float("inf")
            if o.numel():
                error = max(error, float((o.double() - e.detach().double()).abs().max()))
        elif isinstance(e, (int, float, bool)) and e != o:
            error = max(error, abs(float(e) - float(o)))
    return error


def _max_magnitude(expected) -> float:
    return max((float(e.detach().double().abs().max()) for e in _flat(expected)
                if isinstance(e, torch.Tensor) and e.numel()), default=0.0)


def lower_and_compare(exported: torch.export.ExportedProgram, inputs: Sequence[torch.Tensor],
                      passes: Optional[list] = None, runs: int = 50, *, compare: bool = True,
                      bench_seconds: float = 30.0, progress: Optional[Progress] = None,
                      near_misses: bool = False) -> ComparisonResult:
    """Lower and fuse `exported`, build its .pte, run it once on the runtime against eager.

    compare: also build the stock program (`correctness_passes()`, no fusion) and check it.
    runs: time each program up to this many runs (0: no timing), within `bench_seconds` in all.
    near_misses: the fusion passes also record near misses (`ComparisonResult.near_misses`).
    """
    import etfuse.kernels
    from etfuse.runtime import load_method

    etfuse.kernels.prepare()  # the runtime library compiles (first run) while the program is fused
    stage = progress or _no_progress
    inputs = tuple(inputs)
    if passes is None:
        with stage("preparing the fusion rules"):  # each rule's pattern is traced and lowered once per process
            passes = default_passes()
    if near_misses:
        for p in passes:
            if isinstance(p, FusionPass):
                p.near_misses = True

    with stage("eager reference run"):
        with torch.no_grad():
            expected = exported.module()(*inputs)
    with stage("lowering to the edge dialect"):
        edge = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        # to_executorch rewrites the program it lowers in place: the stock program gets its own copy.
        stock_edge = copy.deepcopy(edge) if compare else None
    with stage("fusion"):
        fused = fuse(edge, passes)
        before = op_histogram(edge.exported_program().graph_module)
        after = op_histogram(fused.exported_program().graph_module)
        report = [p.report for p in passes if isinstance(p, FusionPass)]
    with stage("building the .pte"):
        pte = fused.to_executorch().buffer
    with stage("loading the kernels"):
        import etfuse.kernels

        etfuse.kernels.load()
    with stage("runtime check against eager"):
        fused_method = load_method(pte)
        checked = fused_method.check_inputs(inputs)
        error = _max_abs_error(fused_method.execute_unchecked(checked), expected)
    scale = _max_magnitude(expected)
    result = ComparisonResult(
        ops_before=before, ops_after=after,
        fused=[f for r in report for f in r.fused], declined=[d for r in report for d in r.declined],
        max_abs_error=error, pte=pte, max_rel_error=error / scale if scale else error,
        near_misses=[m for r in report for m in r.near_misses] if near_misses else None,
    )
    unfused_method = None
    if compare:
        with stage("stock program: .pte and runtime check"):
            unfused_pte = result.stock_pte = stock_edge.transform(correctness_passes()).to_executorch().buffer
            unfused_method = load_method(unfused_pte)
            result.stock_max_abs_error = _max_abs_error(unfused_method.execute_unchecked(checked), expected)
    if runs > 0:
        with stage(f"timing (up to {runs} runs{' each' if compare else ''}, {bench_seconds:g} s budget)"):
            share = bench_seconds / (2 if compare else 1)
            result.latency_fused_ms, n = _median_ms(fused_method, checked, runs, share)
            if unfused_method is not None:
                result.latency_unfused_ms, m = _median_ms(unfused_method, checked, runs, share)
                n = min(n, m)
            result.bench_runs = n
    return result
