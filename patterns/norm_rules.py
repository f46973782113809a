"""RMS norm, as llama (executorch's example models) and transformers write it by hand.

| rule                          | edge pattern                                                          | backend op       |
|-------------------------------|-----------------------------------------------------------------------|------------------|
| rms_norm[_pow][_no_weight]    | mul(x, rsqrt(add(mean.dim(mul(x, x) or pow(x, 2), [-1], True), eps))) | etfuse::rms_norm |
|                               | [-> mul(., weight)]                                                   |                  |

`eps` is a Python float in the model; `to_edge` lifts it into a 0-dim tensor constant, so the
rule binds it as a tensor and its constraint reads the value (`Match.constant`): a program
whose eps is not known (a computed tensor) keeps its stock ops. The weight is one value per
element of the last dimension.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import RMS_NORM

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


NORM_RULES = [
    Rule("rms_norm" + ("_pow" if pow_form else "") + ("" if weighted else "_no_weight"), _pattern(pow_form, weighted),
         RMS_NORM, _examples(weighted),
         all_of(tensors(["input", "eps"] + (["weight"] if weighted else [])), output_dtype(torch.float32),
                _fits(weighted)),
         _arguments(weighted))
    for pow_form in (False, True) for weighted in (True, False)
]
