"""Layout: the edge dialect's `permute_copy` on etfuse's strided gather.

| rule             | edge pattern                  | backend op           |
|------------------|-------------------------------|----------------------|
| permute_copy_<r> | permute_copy(x, dims), rank r | etfuse::permute_copy |

One rule per rank 2..5: each entry of `dims` is a scalar parameter (found by example value, so
each rank's example is a permutation of distinct values). A permute inside a larger pattern
(a linear's weight transpose, attention's k^T) is that rule's: matches ending later in the graph
are taken first.
"""

from __future__ import annotations

import inspect

import torch

from etfuse.backend_ops import PERMUTE_COPY

from .rule import Match, Rule

aten = torch.ops.aten
_BYTES = (1, 2, 4, 8)


def _rule(rank: int) -> Rule:
    names = [f"d{i}" for i in range(rank)]
    example = list(reversed(range(rank)))  # a permutation of distinct values

    def pattern(x, *dims):
        return aten.permute.default(x, list(dims))

    # one named parameter per entry of dims (the rule's scalars are found by parameter name)
    pattern.__signature__ = inspect.Signature(
        [inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])

    def check(m: Match):
        x = m.value("x")
        if not isinstance(x, torch.Tensor) or x.element_size() not in _BYTES:
            return "the input's elements are not 1, 2, 4 or 8 bytes"
        if not all(isinstance(m.bindings[n], int) for n in names):
            return "dims are not constants"
        return None

    return Rule(f"permute_copy_{rank}", pattern, PERMUTE_COPY,
                lambda: (torch.randn(*range(2, 2 + rank)), *example), check,
                lambda m: ((m.bindings["x"], [m.bindings[n] for n in names]), {}))


LAYOUT_RULES = [_rule(rank) for rank in (2, 3, 4, 5)]
