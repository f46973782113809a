"""Time per operator on the ExecuTorch runtime, from ETDump.

    prof = etfuse.profile(fused.to_executorch(), inputs)      # or a .pte path / bytes; also
                                                             # etfuse.profiling.profile, etfuse.report.profile
    print(prof.to_markdown(top=10))
    prof.rows[0]          # OpTime(op='etfuse::conv2d_act', calls=17, total_ms=1.9, share=0.62)

The program runs `warmup + runs` times with ETDump enabled (`Runtime.load_program(...,
enable_etdump=True)`); `executorch.devtools.Inspector` reads the dump. Every kernel call is an
`OPERATOR_CALL` event tagged with its instruction id, which the program's execution plan maps to
the operator it calls: this names etfuse's own kernels too (they are registered without the
`native_call_*` events the stock kernels emit). An op's time is the mean over the measured runs
of the time its instructions took in a run: means add up (a sum of per-instruction medians does
not: on a busy machine it came out at half of the median `Method::execute`), so `share` is the
op's part of the time spent in operators, the shares sum to 1, and the operator times add up
to `execute_ms` (the mean `Method::execute`) less the runtime's own overhead. Control-flow jumps
and moves (a few nanoseconds each) are not operators and are left out.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import warnings
from typing import Optional, Sequence

import torch

__all__ = ["OpTime", "OpProfile", "profile", "pte_bytes", "op_base"]


@dataclasses.dataclass
class OpTime:
    op: str  # "aten::max_pool2d_with_indices", "etfuse::conv2d_act", ...
    calls: int  # kernel calls per run
    total_ms: float  # time per run, all its calls together (mean over the measured runs)
    share: float  # of the time in operators, 0..1


@dataclasses.dataclass
class OpProfile:
    """Per-operator time of one program; `rows` sorted by time, largest first."""

    rows: list[OpTime]
    runs: int
    execute_ms: float  # mean `Method::execute` over the measured runs, ETDump on
    label: str = ""
    execute_median_ms: float = float("nan")  # its median: far below the mean says the machine was busy

    @property
    def total_ms(self) -> float:
        """Time per run spent in operators (the sum of `rows`)."""
        return sum(r.total_ms for r in self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, op: str) -> Optional[OpTime]:
        """The row of `op`, by full name (`aten::sigmoid`) or base name (`sigmoid`)."""
        for r in self.rows:
            if r.op == op or op_base(r.op) == op:
                return r
        return None

    def top(self, n: int) -> list[OpTime]:
        return self.rows[:n]

    def table(self, top: Optional[int] = None) -> tuple[list[str], list[list[str]]]:
        """Header and rows as text: the `top` ops, then one "(N other ops)" row for the rest."""
        head = ["op", "calls", "ms / run", "share"]
        shown = self.rows if top is None else self.rows[:top]
        body = [[r.op, str(r.calls), f"{r.total_ms:.3f}", f"{100 * r.share:.1f}%"] for r in shown]
        rest = self.rows[len(shown):]
        if rest:
            body.append([f"({len(rest)} other ops)", str(sum(r.calls for r in rest)),
                         f"{sum(r.total_ms for r in rest):.3f}", f"{100 * sum(r.share for r in rest):.1f}%"])
        return head, body

    def to_markdown(self, top: Optional[int] = None) -> str:
        head, body = self.table(top)
        lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|"]
        lines += ["| " + " | ".join(f"`{c}`" if i == 0 and not c.startswith("(") else c for i, c in enumerate(row)) + " |"
                  for row in body]
        return "\n".join(lines)

    def __str__(self) -> str:
        head, body = self.table(10)
        width = max(len(r[0]) for r in [head, *body])
        out = [f"{self.label or 'profile'}: {self.total_ms:.3f} ms in operators, execute {self.execute_ms:.3f} ms "
               f"(mean of {self.runs} runs)"]
        out += [f"  {r[0]:<{width}} {r[1]:>6} {r[2]:>10} {r[3]:>7}" for r in [head, *body]]
        return "\n".join(out)


def op_base(op: str) -> str:
    """`aten::add.out` -> `add`: the operator without namespace and overload."""
    return op.split("::")[-1].split(".")[0]


def pte_bytes(program) -> bytes:
    """The .pte of `program`: bytes, a path, an `ExecutorchProgramManager` (`.buffer`), an
    `EdgeProgramManager` (a copy is lowered: the caller's stays as it is) or an
    `ExportedProgram` (edge dialect, or ATen which is lowered with `etfuse.to_edge` first)."""
    from executorch.exir import EdgeProgramManager
    from torch.export import ExportedProgram

    if isinstance(program, (bytes, bytearray, memoryview)):
        return bytes(program)
    if isinstance(program, (str, os.PathLike)):
        with open(program, "rb") as f:
            return f.read()
    if hasattr(program, "buffer"):
        return program.buffer
    if isinstance(program, ExportedProgram):
        if program.dialect == "EDGE":
            program = EdgeProgramManager({"forward": program})
        else:
            import etfuse

            program = etfuse.to_edge(program)
    if isinstance(program, EdgeProgramManager):
        from etfuse.passes.fused_program import FusedEdgeProgramManager

        if not isinstance(program, FusedEdgeProgramManager):  # executorch's lowers in place
            program = FusedEdgeProgramManager.replacing_programs(program, program._edge_programs)
        return program.to_executorch().buffer
    raise TypeError(f"etfuse.profile takes a .pte (bytes or path) or a program, got {type(program).__name__}")


def _instruction_ops(pte: bytes, method: str) -> dict[int, str]:
    """Instruction id -> operator name, for the kernel calls of `method`'s first chain."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall

    program = deserialize_pte_binary(pte).program
    plan = next((p for p in program.execution_plan if p.name == method), None)
    if plan is None:
        raise ValueError(f"the program has no method {method!r}")
    out = {}
    for i, ins in enumerate(plan.chains[0].instructions):
        args = ins.instr_args
        if isinstance(args, KernelCall):
            out[i] = plan.operators[args.op_index].name
        elif isinstance(args, DelegateCall):
            out[i] = f"delegate:{plan.delegates[args.delegate_index].id}"
    return out


def profile(program, inputs: Sequence[torch.Tensor], runs: int = 10, warmup: int = 1,
            method: str = "forward", label: str = "") -> OpProfile:
    """Run `program` `warmup + runs` times on the ExecuTorch runtime with ETDump on and return
    the time per operator of the last `runs` runs (`OpProfile`). `program` is anything
    `pte_bytes` takes; etfuse's kernels are loaded first so fused ops run."""
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    import etfuse.kernels

    if runs < 1:
        raise ValueError("runs must be at least 1")
    etfuse.kernels.load()
    pte = pte_bytes(program)
    loaded = Runtime.get().load_program(pte, enable_etdump=True)  # reads `pte` in place: keep it alive
    m = loaded.load_method(method)
    inputs = tuple(inputs)
    for _ in range(warmup + runs):
        m.execute(inputs)
    with tempfile.TemporaryDirectory(prefix="etfuse-etdump-") as d:
        path = os.path.join(d, "etdump.etdp")
        loaded.write_etdump_result_to_file(path, os.path.join(d, "debug.bin"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Output Buffer not found": no tensor data asked for
            inspector = Inspector(etdump_path=path)
    del m, loaded
    ops = _instruction_ops(pte, method)
    per_op: dict[str, list] = {}
    execute = []
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for e in block.events:
            raw = list(e.perf_data.raw) if e.perf_data else []
            measured = raw[warmup:] or raw
            if not measured:
                continue
            if e.name == "Method::execute":
                execute += measured
                continue
            if e.name not in ("OPERATOR_CALL", "DELEGATE_CALL"):
                continue  # native_call_* nest inside OPERATOR_CALL; jumps/moves are not operators
            op = ops.get(getattr(e, "_instruction_id", None), f"instruction {getattr(e, '_instruction_id', '?')}")
            entry = per_op.setdefault(op, [0, 0.0])
            entry[0] += 1
            entry[1] += statistics.fmean(measured)
    total = sum(t for _, t in per_op.values()) or 1.0
    rows = [OpTime(op, calls, t, t / total) for op, (calls, t) in per_op.items()]
    rows.sort(key=lambda r: (-r.total_ms, r.op))
    nan = float("nan")
    return OpProfile(rows, runs, statistics.fmean(execute) if execute else nan, label,
                     statistics.median(execute) if execute else nan)
