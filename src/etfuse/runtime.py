"""Run programs on the ExecuTorch runtime in this process, with etfuse's kernels loaded."""

from __future__ import annotations

import os
from typing import Sequence

import torch


def load_method(program, method: str = "forward"):
    """An ExecuTorch runtime `Method` for a .pte given as bytes, a path, or an
    `ExecutorchProgramManager`. Loads etfuse's kernels first so fused ops resolve."""
    from executorch.runtime import Runtime

    import etfuse.kernels

    etfuse.kernels.load()
    if hasattr(program, "buffer"):
        program = program.buffer
    if not isinstance(program, (bytes, bytearray)):
        program = os.fspath(program)
    return Runtime.get().load_program(program).load_method(method)


def run(program, inputs: Sequence[torch.Tensor], method: str = "forward") -> list:
    """Execute `method` of a .pte once on the ExecuTorch runtime; returns its outputs."""
    return list(load_method(program, method).execute(tuple(inputs)))
