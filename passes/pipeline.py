"""The recommended pass list and `fuse`, the one-call entry point.

Three routes run the same passes and give the same program (tests/test_routes.py):

    etfuse.fuse(edge)                                                  # this module
    edge.transform(etfuse.passes.default_passes())                     # executorch's pass manager
    edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))

Every pass in `default_passes()` is an `ExportPass` that takes a graph module and returns a new
one, so each route works with what it is given. `fuse` adds what only the whole program allows:
it folds the weight arithmetic passes wrote into constants (`constant_folding.py`), verifies only
the nodes etfuse wrote (`verify.py`), raises etfuse's errors as themselves, and returns a program
whose `to_executorch()` leaves it intact (`fused_program.py`).
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence, Union

import torch
import torch.fx as fx
from executorch.exir import EdgeProgramManager
from executorch.exir.pass_base import ExportedProgramPassBase
from torch.export import ExportedProgram

from .batch_norm_folding import BatchNormFoldPass
from .compat.typed_pass_errors import install_typed_pass_errors
from .cond_outputs import CondOutputCopyPass
from .cond_views import CondViewCopyPass
from .constant_folding import ConstantFoldingPass, fold_constants
from .float_fusion import FloatFusionPass
from .fused_program import FusedEdgeProgramManager
from .gemm_conv_fusion import GemmConvFusionPass
from .graph_copy import copy_graph_module, graph_modules, program_with
from .loop_lowering import CONSTANT_VALUE, LoopLoweringPass
from .quant_fusion import QuantFusionPass
from .symint_to_prims import SymIntToPrimsPass
from .verify import verify_written_nodes


def default_passes() -> list:
    """etfuse's passes in the order they should run.

    Loops are lowered first so fusion reaches their bodies; batch norms are folded into their
    conv/linear before those fuse; quantized patterns before float ones (relu(add(dq, dq)) is a
    quantized add_relu, not a float one); conv/linear epilogues before the generic float rules;
    the cond-output and cond-view copies (executorch 1.5.1 memory bugs) and the SymInt lowering
    on the final graph; last, the weight arithmetic passes wrote is folded into constants where
    the route hands over the whole program (`fuse`, `transform`).
    """
    install_typed_pass_errors()  # so `edge.transform(default_passes())` raises etfuse's errors as themselves
    return [
        LoopLoweringPass(), BatchNormFoldPass(), QuantFusionPass(), GemmConvFusionPass(), FloatFusionPass(),
        CondOutputCopyPass(), CondViewCopyPass(), SymIntToPrimsPass(), ConstantFoldingPass(),
    ]


Program = Union[EdgeProgramManager, ExportedProgram]

# executorch's verifier and fake-tensor machinery keep process-wide state (side tables, shape
# environments) that concurrent passes corrupt (seen: "Node ... is not added to the side table"
# with 4 threads). One fuse at a time; other threads wait.
_FUSE_LOCK = threading.Lock()


def fuse(program: Program, passes: Optional[Sequence] = None) -> Program:
    """Fuse an `EdgeProgramManager` or an edge-dialect `ExportedProgram`; returns the same type.

    The caller's object is never modified and shares no graph module with the result. An error
    raised by an etfuse pass arrives as itself (`LoopLoweringError`, `FusionError`, ...); any
    error leaves the caller's program as it was.
    """
    passes = list(default_passes() if passes is None else passes)
    if isinstance(program, EdgeProgramManager):
        manager = program
    elif isinstance(program, ExportedProgram):
        if program.dialect != "EDGE":
            raise TypeError(
                f"etfuse.fuse takes an edge-dialect program, got a {program.dialect} ExportedProgram: "
                "lower it first with executorch.exir.to_edge(program)"
            )
        manager = EdgeProgramManager({"forward": program})
    else:
        raise TypeError(
            f"etfuse.fuse takes an EdgeProgramManager or an edge ExportedProgram, got {type(program).__name__}"
        )
    with _FUSE_LOCK:
        fused = {name: _run(ep, passes, manager.compile_config)
                 for name, ep in manager._edge_programs.items()}
    result = FusedEdgeProgramManager.replacing_programs(manager, fused)
    return result if isinstance(program, EdgeProgramManager) else result.exported_program()


def _with_constant_values(ep: ExportedProgram) -> fx.GraphModule:
    """A copy of `ep`'s graph module whose one-element constant inputs carry their value in
    `meta[CONSTANT_VALUE]`, for passes that need a small constant a graph module cannot give
    (a loop counter's `torch.tensor(0)`); `_run` removes them again."""
    gm = copy_graph_module(ep.graph_module)  # node meta dicts are the copy's own
    sig = ep.graph_signature
    for n in gm.graph.find_nodes(op="placeholder"):
        target = sig.inputs_to_lifted_tensor_constants.get(n.name)
        value = ep.constants.get(target) if target is not None else None
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            n.meta[CONSTANT_VALUE] = value
    return gm


def _run(ep: ExportedProgram, passes: list, compile_config) -> ExportedProgram:
    """`passes` over one program: graph-module passes on the graph module (no program rebuilt or
    verified between them), `ExportedProgramPassBase` passes on a program; then constants folded
    and the nodes etfuse wrote verified."""
    gm = _with_constant_values(ep)
    for i, p in enumerate(passes):
        try:
            if isinstance(p, ExportedProgramPassBase):
                current = program_with(ep, gm) if gm is not ep.graph_module else ep
                ep = p(current).exported_program
                gm = ep.graph_module
            else:
                res = p(gm)
                if res is None:
                    raise TypeError(f"pass {p!r} returned None, not a PassResult")
                if res.modified:
                    gm = res.graph_module
        except Exception as e:
            e.add_note(f"(etfuse.fuse: in pass {i} of {len(passes)}, {p!r})")
            raise
    for _, m in graph_modules(gm):
        for n in m.graph.find_nodes(op="placeholder"):
            n.meta.pop(CONSTANT_VALUE, None)
    out = fold_constants(program_with(ep, gm))
    verify_written_nodes(out.graph_module, compile_config)
    return out
