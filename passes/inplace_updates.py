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
    """Switch the program's etfuse ops with in-place forms to them where safe (in place; returned).
    Memory planning gives an in-place result its input's storage but ends that storage's lifetime
    at the in-place op, so only a mutable buffer (storage for the whole program) is written in
    place:
    * a program with control flow (`scan` / `cond` / `while_loop`) stays functional: a `scan` whose
      output got the same offset overwrote the operand its later iterations still read (fuzz seed
      44 graph 149), and a `cond`'s output overwrote a KV cache the program returns (seed 47 graph
      396); switching such results back after `reinplace_pass` is not enough, since the pass also
      drops the buffer's write-back;
    * a write into an intermediate (a KV-cache update on a copy) goes back to the functional op
      after `reinplace_pass` (no write-back to lose): an rms_norm reading the written copy got the
      copy's offset for its output and overwrote the copy the program returns (seed 44 graph 2329)."""
    from executorch.exir.passes.reinplace import reinplace_pass

    overrides = inplace_overrides()
    if not any(n.op == "call_function" and n.target in overrides for n in program.graph.nodes):
        return program
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)
           for n in program.graph.nodes):
        return program
    program = reinplace_pass(program, ops_to_inplace=(), inplace_overrides=overrides)
    functional = {inplace: op for op, inplace in overrides.items()}
    buffers = set(program.graph_signature.inputs_to_buffers)
    for n in program.graph.nodes:
        if n.op == "call_function" and n.target in functional:
            written = n.args[0]
            if not (written.op == "placeholder" and written.name in buffers):
                n.target = functional[n.target]
    program.graph_module.recompile()
    return program
