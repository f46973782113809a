"""Attention backend ops: scaled dot-product attention as one kernel instead of the edge
dialect's fourteen-op decomposition (expand/view/bmm, softmax, the all-masked-row fix-up)."""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _sdpa(query, key, value, mask=None, scale=1.0):
    # enable_gqa: key and value may have fewer heads than query (each serves H / Hk query heads)
    return aten.scaled_dot_product_attention.default(query, key, value, mask, scale=scale,
                                                     enable_gqa=key.shape[1] != query.shape[1])


SDPA = register(BackendOp(
    "etfuse", "sdpa(Tensor query, Tensor key, Tensor value, Tensor? mask=None, float scale=1.0) -> Tensor", _sdpa,
    doc="softmax(scale * query @ key^T + mask) @ value over [B, H, L, D] / [B, Hk, S, D] / [B, Hk, S, Dv] (Hk "
        "dividing H: grouped-query heads read in place), an "
        "additive float mask broadcast to [B, H, L, S]; a row whose scores are all -inf gives 0 (as the edge "
        "dialect's decomposition does); inputs read through their strides", kernel="sdpa"))

ATTENTION_OPS = [SDPA]
