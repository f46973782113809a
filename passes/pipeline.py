"""The recommended pass list and `fuse`, the one-call entry point."""

from __future__ import annotations

import copy
from typing import Optional, Sequence, Union

from executorch.exir import EdgeProgramManager
from torch.export import ExportedProgram

from .batch_norm_folding import BatchNormFoldPass
from .cond_outputs import CondOutputCopyPass
from .gemm_conv_fusion import GemmConvFusionPass
from .float_fusion import FloatFusionPass
from .loop_lowering import LoopLoweringPass
from .quant_fusion import QuantFusionPass
from .symint_to_prims import SymIntToPrimsPass
from .engine import FusionError
from .fusion_pass import FusionPass


def default_passes() -> list:
    """etfuse's passes in the order they should run.

    Loops are lowered first so fusion reaches their bodies; batch norms are folded into their
    conv/linear before those fuse; quantized patterns before float ones (relu(add(dq, dq)) is a
    quantized add_relu, not a float one); conv/linear epilogues before the generic float rules;
    the cond-output copy and the SymInt lowering last, on the final graph.
    """
    return [
        LoopLoweringPass(), BatchNormFoldPass(), QuantFusionPass(), GemmConvFusionPass(), FloatFusionPass(),
        CondOutputCopyPass(), SymIntToPrimsPass(),
    ]


# Passes that never modify the program they are given (each has a test saying so): `fuse` need
# not copy the caller's program for them.
_PRESERVE_INPUT = (FusionPass, BatchNormFoldPass, LoopLoweringPass, CondOutputCopyPass, SymIntToPrimsPass)


Program = Union[EdgeProgramManager, ExportedProgram]


def fuse(program: Program, passes: Optional[Sequence] = None) -> Program:
    """Fuse an `EdgeProgramManager` or an edge-dialect `ExportedProgram`; returns the same type.

    The caller's object is never modified: etfuse's passes return new graph modules, and if
    `passes` holds any other pass, they all run on a copy.
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
    if not all(isinstance(p, _PRESERVE_INPUT) for p in passes):
        manager = copy.deepcopy(manager)
    try:
        fused = manager.transform(passes)
    except Exception as e:
        # executorch's PassManager wraps errors in a generic one; surface etfuse's own.
        raise _fusion_error_in(e) or e
    return fused if isinstance(program, EdgeProgramManager) else fused.exported_program()


def _fusion_error_in(error: BaseException) -> Optional[FusionError]:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, FusionError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
