"""Rotary position embedding as executorch's llama writes it (`apply_rotary_emb`: reshape to
pairs, unbind, rotate, stack, flatten(3)), for q or k of rank 4 ([B, S, H, D]).

| rule | edge pattern                                                                                   | backend op  |
|------|------------------------------------------------------------------------------------------------|-------------|
| rope | view(x, [.., -1, 2]) -> slice+squeeze x2 -> r*cos - i*sin, r*sin + i*cos -> unsqueeze x2 -> cat -> view(x's shape) | etfuse::rope |

The view sizes are free in the pattern (`free_sizes`); the constraint checks that they are x's
shape with the last dim in pairs, and back. cos and sin are whatever broadcasts to
[B, S, H, D / 2] (llama's [1, S, 1, D / 2] slices of its precomputed tables). S may be symbolic
(a dynamic sequence length): sizes are compared as `constraints.same_shapes` does, equal only
when provably so.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import ROPE

from .constraints import all_of, broadcasts, same_shapes, tensors
from .rule import Match, Rule

aten = torch.ops.aten


def _rope(x, cos, sin):
    r, i = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    return torch.stack([r * cos - i * sin, r * sin + i * cos], dim=-1).flatten(3)


def _fits(m: Match):
    """x [B, S, H, D] with D static and even; the other sizes may be symbolic (S: a dynamic
    sequence length; the kernel reads every size at run time)."""
    x, cos, sin = m.value("x"), m.value("cos"), m.value("sin")
    shape = tuple(x.shape)
    if x.dim() != 4 or not isinstance(shape[-1], int) or shape[-1] % 2:
        return f"x {shape}: the rule takes [B, S, H, D] with D static and even"
    half = (*shape[:-1], shape[-1] // 2)
    for name, t in (("cos", cos), ("sin", sin)):
        if not broadcasts(t.shape, half):
            return f"{name} {tuple(t.shape)} does not broadcast to {half}"
    views = [tuple(v.meta["val"].shape) for v in m.nodes if getattr(v.target, "_op", v.target) is aten.view_copy.default]
    if not same_shapes(views, [(*half, 2), shape]):
        return f"the views make {views}, not x's last dim in pairs and back"
    return None


ROPE_RULES = [
    Rule("rope", _rope, ROPE, lambda: (torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)),
         all_of(tensors(["x", "cos", "sin"]), _fits), free_sizes=True),
]
