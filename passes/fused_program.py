"""`FusedEdgeProgramManager`: what `etfuse.fuse` returns, an `EdgeProgramManager` that survives
its own lowering.

executorch's `EdgeProgramManager.to_executorch()` rewrites the manager's graph modules in place
(out variants, `memory.alloc`, planned memory specs), so after it the program the user holds
can no longer be retraced (`run_decompositions()` fails on the `.out` ops) nor lowered again.
This subclass lowers a copy of its graph modules (weights are shared, not copied), so

    fused = etfuse.fuse(edge)
    pte = fused.to_executorch()
    fused.exported_program().run_decompositions()   # still the fused program, retraceable

works in any order. The copies run etfuse's in-place forms where executorch allows
(passes/inplace_updates.py: a KV-cache write lands in the cache buffer, with no write-back copy)
and call the quantized_decomposed ops etfuse has kernels for by their etfuse names
(passes/runtime_names.py: the `.pte` runs beside executorch's stock quantized kernels).
Lowering runs under `torch.no_grad()` (an inference program; executorch's
retrace of a loop whose carry depends on a parameter fails in autograd otherwise). Everything else
is executorch's `EdgeProgramManager`.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from .graph_copy import program_with
from .inplace_updates import run_inplace_updates
from .runtime_names import EmitRuntimeNamesPass


class FusedEdgeProgramManager(EdgeProgramManager):
    """An `EdgeProgramManager` whose `to_executorch()` does not modify it."""

    @classmethod
    def replacing_programs(cls, manager: EdgeProgramManager, programs: dict[str, ExportedProgram]):
        """`manager`'s configuration with `programs` in place of its own (no re-verification: the
        caller verified what it changed)."""
        new = cls.__new__(cls)
        new.__dict__.update(manager.__dict__)
        new._edge_programs = dict(programs)
        new._config_methods = copy.copy(manager._config_methods)
        return new

    def to_executorch(self, config=None) -> ExecutorchProgramManager:
        # KV-cache writes and other etfuse ops with in-place forms run in place on the copies
        own_graphs = {name: run_inplace_updates(program_with(ep, EmitRuntimeNamesPass()(ep.graph_module).graph_module,
                                                             signature=copy.deepcopy(ep.graph_signature)))
                      for name, ep in self._edge_programs.items()}
        lowering = EdgeProgramManager.__new__(EdgeProgramManager)
        lowering.__dict__.update(self.__dict__)
        lowering._edge_programs = own_graphs
        # executorch's own passes retrace control flow on fake tensors; with grad enabled a scan
        # whose carry depends on a parameter fails in autograd tracing ("outs_to_grad length").
        with torch.no_grad():
            return EdgeProgramManager.to_executorch(lowering, config)
