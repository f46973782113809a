"""Backend ops run in place where the program allows it: executorch's `reinplace_pass`, given
etfuse's in-place forms (`BackendOp.inplace`, e.g. `update_cache -> update_cache_`).

executorch's pass only derives in-place forms of ATen ops, but takes explicit overrides; its
checks decide where the switch is safe (the written tensor is a mutable buffer or an
intermediate, and nothing reads it afterwards). A buffer written by an in-place op needs no
write-back: `to_executorch` inserts no `copy_` of the whole cache after it, and memory planning
gives the result the buffer's storage. `FusedEdgeProgramManager.to_executorch` runs this on its
own copy of each program, so the fused program itself stays functional and retraceable.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram


def inplace_overrides() -> dict:
    """{functional backend op as fused graphs hold it: its in-place ATen overload}."""
    from etfuse.backend_ops import CATALOG, registered_ops

    registered = {op.qualname for op in registered_ops()}
    return {op.backend: op.aten_inplace for op in CATALOG if op.inplace and op.qualname in registered}


def run_inplace_updates(program: ExportedProgram) -> ExportedProgram:
    """Switch the program's etfuse ops with in-place forms to them where safe (in place; returned)."""
    from executorch.exir.passes.reinplace import reinplace_pass

    overrides = inplace_overrides()
    if not any(n.op == "call_function" and n.target in overrides for n in program.graph.nodes):
        return program
    program = reinplace_pass(program, ops_to_inplace=(), inplace_overrides=overrides)
    _keep_functional_where_control_flow_reads(program, overrides)
    return program


def _keep_functional_where_control_flow_reads(program: ExportedProgram, overrides: dict) -> None:
    """An in-place result read by a `scan` / `cond` / `while_loop` goes back to the functional op.
    Memory planning gives the in-place result its input's storage, but ends that storage's lifetime
    at the in-place op, not at the control-flow op that reads it: a `scan` whose output got the same
    offset overwrote the operand its later iterations still read (fuzz seed 44 graph 149)."""
    functional = {inplace: op for op, inplace in overrides.items()}
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in functional and any(
                isinstance(u.target, torch._ops.HigherOrderOperator) for u in node.users):
            node.target = functional[node.target]
    program.graph_module.recompile()
