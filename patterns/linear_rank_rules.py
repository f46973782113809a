"""Linear on any rank: what `nn.Linear` on [..., K] becomes in the edge dialect,
`view_copy(x, [M, K]) -> mm / addmm(., permute_copy(weight)) -> view_copy(., [..., N])`, as one
`etfuse::linear_act` on x as it is (the kernel takes the leading dims), with a SiLU after it as
the op's epilogue.

| rule                              | edge pattern                                                          | backend op         |
|-----------------------------------|-----------------------------------------------------------------------|--------------------|
| linear_nd[_no_bias][_silu]        | view_copy(mm(view_copy(x), permute_copy(w)) or addmm(b, ...))          | etfuse::linear_act |
|                                   | [-> mul(., sigmoid(.))]                                               |                    |

The view sizes depend on the shapes: the rules match any (`free_sizes`) and the constraint checks
that the first view flattens x's leading dims and the second restores them. The matches end
later in the graph than the rank-2 `linear` rules' (at the view or the SiLU's mul), so they are
taken first.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import LINEAR_ACT

from .constraints import all_of, output_dtype, tensors
from .rule import Match, Rule

aten = torch.ops.aten


def _pattern(bias: bool, silu: bool):
    def linear(input, weight, b=None):
        flat = aten.view.default(input, [15, 8])
        w = aten.permute.default(weight, [1, 0])
        y = aten.addmm.default(b, flat, w) if bias else aten.mm.default(flat, w)
        return aten.view.default(y, [3, 5, 6])

    def act(v):
        return aten.mul.Tensor(v, aten.sigmoid.default(v)) if silu else v

    if bias:
        def pattern(input, weight, bias):
            return act(linear(input, weight, bias))
    else:
        def pattern(input, weight):
            return act(linear(input, weight))
    return pattern


def _examples(bias: bool):
    return lambda: (torch.randn(3, 5, 8), torch.randn(6, 8), torch.randn(6)) if bias else (
        torch.randn(3, 5, 8), torch.randn(6, 8))


def _shapes(m: Match):
    x, w = m.value("input"), m.value("weight")
    if x.dim() < 3 or w.dim() != 2 or not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
        return f"input {tuple(x.shape)}, weight {tuple(w.shape)}: linear_nd takes a static input of rank >= 3"
    lead, k, n = tuple(x.shape[:-1]), x.shape[-1], w.shape[0]
    if w.shape[1] != k:
        return f"weight {tuple(w.shape)} does not take {k} input features"
    if "bias" in m.bindings and tuple(m.value("bias").shape) != (n,):
        return f"bias {tuple(m.value('bias').shape)} is not one value per output feature"
    flat = 1
    for d in lead:
        flat *= d
    views = sorted(tuple(v.meta["val"].shape) for v in m.nodes
                   if getattr(v.target, "_op", v.target) is aten.view_copy.default)
    if views != sorted([(flat, k), (*lead, n)]):
        return f"the views make {views}, not x's leading dims flattened and restored"
    return None


def _arguments(bias: bool, silu: bool):
    def arguments(m: Match):
        b = m.bindings
        return (b["input"], b["weight"], b["bias"] if bias else None, None, None, "silu" if silu else "none"), {}
    return arguments


LINEAR_RANK_RULES = [
    Rule("linear_nd" + ("" if bias else "_no_bias") + ("_silu" if silu else ""), _pattern(bias, silu), LINEAR_ACT,
         _examples(bias), all_of(tensors(["input", "weight"] + (["bias"] if bias else [])), output_dtype(torch.float32),
                                 _shapes), _arguments(bias, silu), free_sizes=True)
    for bias in (True, False) for silu in (True, False)
]
