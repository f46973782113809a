"""KV-cache update: a transformer writing the keys or values of the tokens it just decoded into
its cache buffer, `cache[:, :, positions] = values` (`index_put` in the edge dialect).

    update_cache(self, values, positions, dim) = index_put(self, [None] * dim + [positions], values)

In the fused program the op is functional like every backend op (it retraces to `index_put`).
`to_executorch` of a fused program (passes/fused_program.py) switches it to its in-place form
`update_cache_` where executorch's reinplace checks allow it (self is a mutable buffer that
nothing reads afterwards): the runtime then writes only the new rows, and executorch inserts no
write-back copy of the whole cache (it skips the copy for a buffer mutated in place). Without
that, the stock program copies every cache twice per token (index_put's out, then the write-back).
"""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _update_cache(self, values, positions, dim):
    return aten.index_put.default(self, [None] * dim + [positions], values)


UPDATE_CACHE = register(BackendOp(
    "etfuse", "update_cache(Tensor self, Tensor values, Tensor positions, int dim) -> Tensor",
    _update_cache,
    doc="self with the slices at `positions` (int64 [L]) along `dim` replaced by values (broadcast to self's shape with L at "
        "dim); in place as update_cache_ on the runtime",
    kernel="update_cache", inplace=True))

CACHE_OPS = [UPDATE_CACHE]
