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
    loaded = Runtime.get().load_program(program)
    runtime_method = loaded.load_method(method)
    # The runtime reads the .pte in place (load_program(bytes) does not copy): the bytes and the
    # Program must live as long as the Method.
    runtime_method._etfuse_keepalive = (program, loaded)
    return runtime_method


def run(program, inputs: Sequence[torch.Tensor], method: str = "forward") -> list:
    """Execute `method` of a .pte once on the ExecuTorch runtime; returns its outputs."""
    return list(load_method(program, method).execute(tuple(inputs)))
