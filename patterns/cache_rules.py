"""A KV-cache write, as executorch's llama (`k_cache[:, :, input_pos] = k_val`) and other cache
layouts lower it: one index tensor at dim 1 or 2, None before it.

| rule              | edge pattern                                              | backend op           |
|-------------------|-----------------------------------------------------------|----------------------|
| update_cache_dim1 | index_put(self, [None, positions], values)                | etfuse::update_cache |
| update_cache_dim2 | index_put(self, [None, None, positions], values)          | etfuse::update_cache |

The values broadcast to the indexed slices (self's shape with len(positions) at dim; llama's
are [H, L, D] for a [1, H, S, D] cache), positions are int64 [L], `accumulate` is False: anything
else keeps the stock op. L may be symbolic (a dynamic sequence length: executorch's llama export
writes `index_copy_(cache, 2, arange(L) + start_pos, values)`, which lowers to this index_put);
sizes are compared as `constraints.broadcasts` does, equal only when provably so, and the kernel
reads them at run time. Which fused writes then run in place is decided by `to_executorch`
(backend_ops/cache_ops.py).
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import UPDATE_CACHE

from .constraints import broadcasts
from .rule import Match, Rule

aten = torch.ops.aten

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64)


def _pattern(dim: int):
    def pattern(self, values, positions):
        return aten.index_put.default(self, [None] * dim + [positions], values)
    return pattern


def _examples(dim: int):
    def make():
        cache = torch.randn(1, 4, 8, 6)
        shape = list(cache.shape)
        shape[dim] = 2
        return cache, torch.randn(shape), torch.tensor([3, 4])
    return make


def _fits(dim: int):
    def check(m: Match):
        cache, values, positions = m.value("self"), m.value("values"), m.value("positions")
        if not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in (cache, values, positions)):
            return "self, values and positions must be cpu tensors"
        if cache.dtype not in _VALUE_DTYPES or values.dtype != cache.dtype:
            return f"self {cache.dtype} and values {values.dtype}: the kernel writes values of self's dtype"
        if positions.dtype != torch.int64 or positions.dim() != 1:
            return f"positions must be int64 [L], got {positions.dtype} {tuple(positions.shape)}"
        want = list(cache.shape)
        if cache.dim() <= dim:
            return f"self has rank {cache.dim()}, no dim {dim}"
        want[dim] = positions.shape[0]
        if not broadcasts(values.shape, want):
            return f"values {tuple(values.shape)} do not broadcast to the indexed slices {tuple(want)}"
        return None
    return check


def _arguments(dim: int):
    def arguments(m: Match):
        b = m.bindings
        return (b["self"], b["values"], b["positions"], dim), {}
    return arguments


CACHE_RULES = [
    Rule(f"update_cache_dim{dim}", _pattern(dim), UPDATE_CACHE, _examples(dim), _fits(dim), _arguments(dim))
    for dim in (1, 2)
]
