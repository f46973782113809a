"""Layout backend ops: copies the portable runtime makes slowly (it recomputes every element's
source index), as strided gathers over runs."""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _permute_copy(self, dims):
    return aten.permute_copy.default(self, dims)


PERMUTE_COPY = register(BackendOp(
    "etfuse", "permute_copy(Tensor self, int[] dims) -> Tensor", _permute_copy,
    doc="self permuted by dims, written contiguous; any dtype of 1, 2, 4 or 8 bytes (runs that stay contiguous "
        "are copied whole)", kernel="permute_copy"))

LAYOUT_OPS = [PERMUTE_COPY]
