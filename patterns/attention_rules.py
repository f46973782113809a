"""Attention: the edge dialect's decomposition of `scaled_dot_product_attention` as one op.

| rule                             | edge pattern                                                   | backend op   |
|----------------------------------|----------------------------------------------------------------|--------------|
| sdpa[_grouped][_masked][_closed] | mul(q, s), mul(permute(k), s) -> expand/view -> bmm -> view     | etfuse::sdpa |
|                                  | [-> add(., mask)] -> _softmax with its all--inf-row fix-up (eq, |              |
|                                  | logical_not, any, full_like, where) -> expand/view -> bmm(., v) |              |
|                                  | -> view [-> permute -> copy -> permute]                         |              |

`to_edge` lowers SDPA (math form) by scaling q and k^T by s = sqrt(scale) each; the rule binds
s and hands the op scale = s * s. A boolean or causal mask reaches the add as the `where(mask, 0,
-inf)` it becomes (that stays a stock op feeding `mask`). The view/expand sizes depend on the
shapes, so the rule matches any (`free_sizes`) and its constraint checks every matched view and
expand against the shapes SDPA gives for q [B, H, L, D], k [B, H, S, D], v [B, H, S, Dv].
The copies export inserts after expanding a non-contiguous q, k or v (`_clone_dim_order`) are
stepped over (`skips`). `_closed`: at batch 1 the decomposition ends with permute -> copy ->
permute, which cancel out; the op's output is already contiguous [B, H, L, Dv].

`_grouped`: k and v reach SDPA through `repeat_interleave(., n_rep, dim=1)` (unsqueeze -> expand
-> copy -> view; llama's grouped-query heads, n_rep = 1 included): the op reads the unrepeated k
and v, each head serving n_rep query heads, so the repeated copies of a KV cache are never made.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import SDPA

from .constraints import broadcasts, same_shape, same_shapes
from .rule import Match, Rule

aten = torch.ops.aten
_S = 0.5  # example of sqrt(scale); 0.5 * 0.5 squares and roots exactly
_SIZED = (aten.view_copy.default, aten.expand_copy.default)
# export copies an expanded non-contiguous q, k or v before its view: value-preserving, stepped over
_COPIES = (torch.ops.dim_order_ops._clone_dim_order.default, aten.clone.default)


def _repeat(x):
    # what `repeat_interleave(x, n_rep, dim=1)` (llama's grouped-query heads) lowers to
    return torch.repeat_interleave(x, 2, dim=1)


def _closing_permutes(x):
    # how the decomposition ends when the batch is 1 (the query's layout is ambiguous then):
    # permute -> copy -> permute, which cancel out value for value
    return aten.permute.default(aten.clone.default(aten.permute.default(x, [2, 0, 1, 3]),
                                                   memory_format=torch.contiguous_format), [1, 2, 0, 3])


def _pattern(masked: bool, grouped: bool, closed: bool):
    kv = _repeat if grouped else (lambda x: x)
    end = _closing_permutes if closed else (lambda x: x)
    if masked:
        def pattern(query, key, value, mask, s):
            return end(aten.scaled_dot_product_attention.default(query, kv(key), kv(value), mask, scale=s * s))
    else:
        def pattern(query, key, value, s):
            return end(aten.scaled_dot_product_attention.default(query, kv(key), kv(value), scale=s * s))
    return pattern


def _examples(masked: bool, grouped: bool):
    def make():
        heads = 2 if grouped else 4
        q, k, v = torch.randn(2, 4, 5, 4), torch.randn(2, heads, 7, 4), torch.randn(2, heads, 7, 6)
        return (q, k, v, torch.randn(5, 7), _S) if masked else (q, k, v, _S)
    return make


def _attention_shapes(grouped: bool):
    return lambda m: _shapes(m, grouped)


def _shapes(m: Match, grouped: bool):
    """q [B, H, L, D], k [B, Hk, S, D], v [B, Hk, S, Dv], the mask broadcasting to [B, H, L, S];
    L and S may be symbolic (a dynamic sequence length), the heads are static."""
    q, k, v = m.value("query"), m.value("key"), m.value("value")
    tensors = [("query", q), ("key", k), ("value", v)] + ([("mask", m.value("mask"))] if "mask" in m.bindings else [])
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return f"{name} is not a float32 tensor"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"query, key, value have ranks {q.dim()}, {k.dim()}, {v.dim()}; sdpa takes 4-D [B, H, L, D]"
    B, H, L, D = q.shape
    Hk, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    if not all(isinstance(d, int) for d in (H, Hk, D, Dv)):
        return f"query {tuple(q.shape)}, value {tuple(v.shape)}: sdpa takes static heads and head sizes"
    if not same_shape(tuple(k.shape), (B, Hk, S, D)) or not same_shape(tuple(v.shape[:3]), (B, Hk, S)) or Hk == 0 or H % Hk:
        return f"key {tuple(k.shape)} and value {tuple(v.shape)} do not fit query {tuple(q.shape)}"
    if not grouped and Hk != H:
        return f"key has {Hk} heads, query {H}"
    if "mask" in m.bindings:
        mask = m.value("mask")
        full = (B, H, L, S)
        if not broadcasts(mask.shape, full):
            return f"mask {tuple(mask.shape)} does not broadcast to the scores {full}"
    # what each view/expand of SDPA's decomposition gives, in any order
    want = [(B, H, L, D), (B * H, L, D), (B, H, D, S), (B * H, D, S), (B, H, L, S), (B, H, L, S),
            (B * H, L, S), (B, H, S, Dv), (B * H, S, Dv), (B, H, L, Dv)] + (
        [(B, Hk, H // Hk, S, D), (B, H, S, D), (B, Hk, H // Hk, S, Dv), (B, H, S, Dv)] if grouped else [])
    got = [tuple(n.meta["val"].shape) for n in m.nodes if getattr(n.target, "_op", n.target) in _SIZED]
    if not same_shapes(got, want):
        return f"the views and expands make {got}, not the attention's {want}"
    if not isinstance(m.bindings["s"], float):
        return "the scale is not a constant"
    return None


def _arguments(masked: bool):
    def arguments(m: Match):
        b = m.bindings
        return (b["query"], b["key"], b["value"], b["mask"] if masked else None, b["s"] * b["s"]), {}
    return arguments


ATTENTION_RULES = [
    Rule("sdpa" + ("_grouped" if grouped else "") + ("_masked" if masked else "") + ("_closed" if closed else ""),
         _pattern(masked, grouped, closed), SDPA, _examples(masked, grouped), _attention_shapes(grouped),
         _arguments(masked), free_sizes=True, skips=_COPIES)
    for masked in (True, False) for grouped in (True, False) for closed in (True, False)
]
