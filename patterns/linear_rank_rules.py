"""Linear on any rank: what `nn.Linear` on [..., K] becomes in the edge dialect,
`view_copy(x, [M, K]) -> mm / addmm(., permute_copy(weight)) -> view_copy(., [..., N])`, as one
`etfuse::linear_act` on x as it is (the kernel takes the leading dims), with the activation after
the final view as the op's epilogue: relu (min 0) or any of `linear_act`'s activations (SiLU,
sigmoid, GELU erf and tanh, hardswish, hardsigmoid), spelled as the rank-2 rules spell them.

| rule                              | edge pattern                                                          | backend op         |
|-----------------------------------|-----------------------------------------------------------------------|--------------------|
| linear_nd[_no_bias][_act]         | view_copy(mm(view_copy(x), permute_copy(w)) or addmm(b, ...))          | etfuse::linear_act |
|   act: relu, silu, sigmoid, gelu, | [-> act(.)]                                                           |                    |
|   gelu_tanh, hardswish, hardsigmoid |                                                                     |                    |

The view sizes depend on the shapes: the rules match any (`free_sizes`) and the constraint checks
that the first view flattens x's leading dims and the second restores them. The matches end
later in the graph than the rank-2 `linear` rules' (at the view or the activation's last op), so
they are taken first, and a rule with an activation ends later than the same linear without one,
so the activation is absorbed whenever it can be.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import LINEAR_ACT

from .constraints import all_of, not_dequantized, output_dtype, same_shape, same_shapes, tensors
from .gemm_conv_rules import _UNARY, _act_examples, _activation, _checked, _named_for, _unary_argument
from .rule import Match, Rule

aten = torch.ops.aten
_ACTS = ("none", "relu", *_UNARY)


def linear_nd(input, weight, b=None):
    """A linear on [3, 5, 8] as the edge dialect spells it (a `free_sizes` rule's views match any
    sizes; `linear_nd_shapes` checks them)."""
    flat = aten.view.default(input, [15, 8])
    w = aten.permute.default(weight, [1, 0])
    y = aten.mm.default(flat, w) if b is None else aten.addmm.default(b, flat, w)
    return aten.view.default(y, [3, 5, 6])


def _pattern(bias: bool, act: str):
    linear = linear_nd

    # lo / hi: a hard activation's constants 3 and 6 (gemm_conv_rules' _named_for renames them)
    if bias:
        def pattern(input, weight, bias, lo=None, hi=None):
            return _activation(act, linear(input, weight, bias), lo, hi)
    else:
        def pattern(input, weight, lo=None, hi=None):
            return _activation(act, linear(input, weight), lo, hi)
    return _named_for(act, pattern)


def _examples(bias: bool, act: str):
    return lambda: (torch.randn(3, 5, 8), torch.randn(6, 8), *((torch.randn(6),) if bias else ()), *_act_examples(act))


def linear_nd_shapes(m: Match):
    """x [..., K] (leading dims static or symbolic: a dynamic sequence length), weight [N, K]
    static, and the views flatten x's leading dims and restore them."""
    x, w = m.value("input"), m.value("weight")
    if x.dim() < 3 or w.dim() != 2 or not all(isinstance(d, int) for d in (x.shape[-1], *w.shape)):
        return f"input {tuple(x.shape)}, weight {tuple(w.shape)}: linear_nd takes an input of rank >= 3 with static features"
    lead, k, n = tuple(x.shape[:-1]), x.shape[-1], w.shape[0]
    if w.shape[1] != k:
        return f"weight {tuple(w.shape)} does not take {k} input features"
    if "bias" in m.bindings and not same_shape(tuple(m.value("bias").shape), (n,)):
        return f"bias {tuple(m.value('bias').shape)} is not one value per output feature"
    flat = 1
    for d in lead:
        flat = flat * d
    views = [tuple(v.meta["val"].shape) for v in m.nodes if getattr(v.target, "_op", v.target) is aten.view_copy.default]
    if not same_shapes(views, [(flat, k), (*lead, n)]):
        return f"the views make {views}, not x's leading dims flattened and restored"
    return None


def _arguments(bias: bool, act: str):
    def arguments(m: Match):
        b = m.bindings
        return (b["input"], b["weight"], b["bias"] if bias else None, 0.0 if act == "relu" else None, None,
                *(_unary_argument(act) or ("none",))), {}
    return arguments


LINEAR_RANK_RULES = [
    Rule("linear_nd" + ("" if bias else "_no_bias") + ("" if act == "none" else f"_{act}"), _pattern(bias, act),
         LINEAR_ACT, _examples(bias, act),
         _checked(all_of(tensors(["input", "weight"] + (["bias"] if bias else [])), output_dtype(torch.float32),
                         linear_nd_shapes, not_dequantized()), act), _arguments(bias, act), free_sizes=True)
    for bias in (True, False) for act in _ACTS
]
