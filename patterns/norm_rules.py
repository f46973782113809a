"""RMS norm, as llama (executorch's example models) and transformers write it by hand, and
layer norm over the last dim, as the edge dialect spells `nn.LayerNorm` / `F.layer_norm`.

| rule                          | edge pattern                                                          | backend op       |
|-------------------------------|-----------------------------------------------------------------------|------------------|
| rms_norm[_pow][_no_weight]    | mul(x, rsqrt(add(mean.dim(mul(x, x) or pow(x, 2), [-1], True), eps))) | etfuse::rms_norm |
|                               | [-> mul(., weight)]                                                   |                  |
| layer_norm                    | native_layer_norm(x, [n], weight, bias, eps)[0]                       | etfuse::layer_norm |

`eps` is a Python float in the model; `to_edge` lifts it into a 0-dim tensor constant, so the
rule binds it as a tensor and its constraint reads the value (`Match.constant`): a program
whose eps is not known (a computed tensor) keeps its stock ops. The weight is one value per
element of the last dimension.

Layer norm: the normalised shape is one dim, the last (`n`, x.shape[-1]); weight and bias may
each be None. A program that reads native_layer_norm's mean or rstd keeps the stock op (the
engine leaves a match whose intermediate has outside users).
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import LAYER_NORM, RMS_NORM

from .constraints import all_of, output_dtype, tensors
from .rule import Match, Rule

aten = torch.ops.aten


def _pattern(pow_form: bool, weighted: bool):
    def square(x):
        return aten.pow.Tensor_Scalar(x, 2) if pow_form else aten.mul.Tensor(x, x)

    def normed(input, eps):
        return aten.mul.Tensor(input, aten.rsqrt.default(aten.add.Tensor(aten.mean.dim(square(input), [-1], True), eps)))

    if weighted:
        def pattern(input, weight, eps):
            return aten.mul.Tensor(normed(input, eps), weight)
    else:
        def pattern(input, eps):
            return normed(input, eps)
    return pattern


def _examples(weighted: bool):
    def make():
        x, eps = torch.randn(3, 8), torch.tensor(1e-5)
        return (x, torch.randn(8), eps) if weighted else (x, eps)
    return make


def _fits(weighted: bool):
    def check(m: Match):
        x = m.value("input")
        if x.dim() == 0:
            return "input is 0-dim"
        if weighted:
            w = m.value("weight")
            if w.dim() != 1 or w.shape[0] != x.shape[-1]:
                return f"weight {tuple(w.shape)} is not one value per element of the last dim ({x.shape[-1]})"
        eps = m.constant("eps")
        if eps is None or eps.numel() != 1 or not eps.dtype.is_floating_point:
            return "eps is not a known float constant"
        return None
    return check


def _arguments(weighted: bool):
    def arguments(m: Match):
        b = m.bindings
        return (b["input"], b["weight"] if weighted else None, float(m.constant("eps"))), {}
    return arguments


def _layer_norm(input, weight, bias, n, eps):
    return aten.native_layer_norm.default(input, [n], weight, bias, eps)[0]


def _layer_norm_fits(m: Match):
    x, n = m.value("input"), m.bindings["n"]
    if x.dim() == 0 or n != x.shape[-1]:
        return f"normalised shape [{n}] is not the last dim of input {tuple(x.shape)}"
    if not isinstance(m.bindings["eps"], float):
        return f"eps is {m.bindings['eps']!r}, not a float constant"
    return None


_LAYER_NORM_RULE = Rule(
    "layer_norm", _layer_norm, LAYER_NORM,
    # n and eps: example scalars no literal of the pattern has (the getitem's 0)
    lambda: (torch.randn(3, 8), torch.randn(8), torch.randn(8), 8, 0.0625),
    all_of(tensors(["input", "weight", "bias"], optional=["weight", "bias"]), output_dtype(torch.float32),
           _layer_norm_fits),
    lambda m: ((m.bindings["input"], m.bindings["weight"], m.bindings["bias"], m.bindings["eps"]), {}))


NORM_RULES = [
    Rule("rms_norm" + ("_pow" if pow_form else "") + ("" if weighted else "_no_weight"), _pattern(pow_form, weighted),
         RMS_NORM, _examples(weighted),
         all_of(tensors(["input", "eps"] + (["weight"] if weighted else [])), output_dtype(torch.float32),
                _fits(weighted)),
         _arguments(weighted))
    for pow_form in (False, True) for weighted in (True, False)
] + [_LAYER_NORM_RULE]
