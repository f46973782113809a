"""Export -> edge -> fuse -> .pte -> run on the ExecuTorch runtime, compared with eager.

Shared by `etfuse demo` and `etfuse fuse`: one function does the whole flow and returns what a
person wants to know about it (ops before/after, what fused where, error, latency).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from typing import Optional, Sequence

import torch
from executorch.exir import EdgeCompileConfig

from .batch_norm_folding import BatchNormFoldPass
from .fusion_pass import FusionPass, graph_modules
from .engine import Fused
from .loop_lowering import to_edge_control_flow
from .pipeline import default_passes, fuse


@dataclasses.dataclass
class LoweringResult:
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    fused: list[Fused]
    declined: list
    max_abs_error: float
    latency_unfused_ms: float
    latency_fused_ms: float
    pte: bytes

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
        lines += [
            "", "## ExecuTorch runtime vs eager PyTorch", "",
            f"- max abs error: {self.max_abs_error:.3g}",
            f"- latency, stock ops: {self.latency_unfused_ms:.3f} ms",
            f"- latency, etfuse-fused: {self.latency_fused_ms:.3f} ms "
            f"({self.latency_unfused_ms / max(self.latency_fused_ms, 1e-9):.2f}x)",
            "",
        ]
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


def _median_ms(method, inputs, runs: int) -> float:
    method.execute(inputs)  # warm up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        method.execute(inputs)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def lower_and_compare(exported: torch.export.ExportedProgram, inputs: Sequence[torch.Tensor],
                      passes: Optional[list] = None, runs: int = 50) -> LoweringResult:
    from etfuse.runtime import load_method

    inputs = tuple(inputs)
    with torch.no_grad():
        expected = exported.module()(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    passes = default_passes() if passes is None else passes

    edge = to_edge_control_flow(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    fused = fuse(edge, passes)
    before = op_histogram(edge.exported_program().graph_module)
    after = op_histogram(fused.exported_program().graph_module)
    report = [p.report for p in passes if isinstance(p, (FusionPass, BatchNormFoldPass))]

    # Lower the fused program first: to_executorch rewrites the caller's bodies in place.
    pte = fused.to_executorch().buffer
    unfused_pte = edge.to_executorch().buffer
    fused_method, unfused_method = load_method(pte), load_method(unfused_pte)
    outputs = fused_method.execute(inputs)
    error = max(float((o - e.detach()).abs().max()) if o.numel() else 0.0 for o, e in zip(outputs, expected))
    return LoweringResult(
        ops_before=before, ops_after=after,
        fused=[f for r in report for f in r.fused], declined=[d for r in report for d in r.declined],
        max_abs_error=error,
        latency_unfused_ms=_median_ms(unfused_method, inputs, runs),
        latency_fused_ms=_median_ms(fused_method, inputs, runs),
        pte=pte,
    )
