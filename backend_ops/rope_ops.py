"""Rotary position embedding, the interleaved form of executorch's llama (`apply_rotary_emb`:
pairs (x[2j], x[2j + 1]) of the last dim rotated by the angle whose cos and sin are given):

    rope(x, cos, sin)[..., 2j]     = x[..., 2j] * cos[..., j] - x[..., 2j + 1] * sin[..., j]
    rope(x, cos, sin)[..., 2j + 1] = x[..., 2j] * sin[..., j] + x[..., 2j + 1] * cos[..., j]

x is float32 [..., D] with D even; cos and sin broadcast to x's shape with D / 2 last (llama's are
[1, S, 1, D / 2] for x [B, S, H, D]). The edge dialect spells it as a view to pairs, two
slice+squeeze, four muls, a sub and an add, two unsqueezes, a cat and a view back: 12 ops and 7
intermediate tensors per q or k, one pass over x here.
"""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _rope(x, cos, sin):
    pairs = aten.reshape.default(x, [*x.shape[:-1], -1, 2])
    r, i = aten.select.int(pairs, -1, 0), aten.select.int(pairs, -1, 1)
    out_r = aten.sub.Tensor(aten.mul.Tensor(r, cos), aten.mul.Tensor(i, sin))
    out_i = aten.add.Tensor(aten.mul.Tensor(r, sin), aten.mul.Tensor(i, cos))
    return aten.reshape.default(aten.stack.default([out_r, out_i], -1), x.shape)


ROPE = register(BackendOp(
    "etfuse", "rope(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rope,
    doc="rotary embedding, interleaved pairs of x's last dim rotated by (cos, sin), which broadcast to x's shape "
        "with D / 2 last (executorch's llama)",
    kernel="rope"))

ROPE_OPS = [ROPE]
