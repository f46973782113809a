"""A linear's residual add: a transformer's skip connection `r + linear(h)` (and the ResNet-style
`relu(r + linear(h))`) as one `etfuse::linear_act` with its residual epilogue. The kernel copies r
into the output and the GEMM adds its sums to it, so the add is not a pass over memory of its own
(MobileBERT has two of them per layer, ViT and llama two per block).

| rule                                  | edge pattern                                       | backend op          |
|---------------------------------------|----------------------------------------------------|---------------------|
| linear[_nd][_no_bias]_residual[_relu] | [relu](add(linear(x, w[, b]), r))  (commutative)    | etfuse::linear_act  |

`linear` is the rank-2 `addmm` / `mm` of gemm_conv_rules, `linear_nd` the `view -> mm -> view` of
linear_rank_rules. The add must be exactly the residual add: alpha 1, and r, the linear's output
and the sum all of one shape (no broadcasting: a bias-like add of [N] is `add_rows`).
"""

from __future__ import annotations

import torch

from etfuse.backend_ops import LINEAR_ACT

from .constraints import all_of, not_dequantized, output_dtype, tensors
from .gemm_conv_rules import _LINEAR_CHECK
from .linear_rank_rules import linear_nd, linear_nd_shapes
from .rule import Match, Rule

aten = torch.ops.aten


def _linear_2d(input, weight, b=None):
    return aten.linear.default(input, weight, b)


def _pattern(linear, bias: bool, relu: bool):
    def finish(y, residual):
        y = aten.add.Tensor(y, residual)
        return aten.relu.default(y) if relu else y

    if bias:
        def pattern(input, weight, bias, residual):
            return finish(linear(input, weight, bias), residual)
    else:
        def pattern(input, weight, residual):
            return finish(linear(input, weight), residual)
    return pattern


def _examples(nd: bool, bias: bool):
    lead = (3, 5) if nd else (4,)
    out = 6 if nd else 16
    k = 8
    return lambda: (torch.randn(*lead, k), torch.randn(out, k), *((torch.randn(out),) if bias else ()),
                    torch.randn(*lead, out))


def _dims(shape) -> list[str]:
    return [str(d) for d in shape]  # SymInts compare by their expression, without a guard


def _residual_shape(m: Match):
    """r is the linear's output shape and the sum's: the add broadcasts nothing."""
    x, w, r = m.value("input"), m.value("weight"), m.value("residual")
    linear_out = [*_dims(x.shape[:-1]), str(w.shape[0])]
    if _dims(r.shape) != linear_out or _dims(m.anchor_value.shape) != linear_out:
        return (f"residual {tuple(r.shape)} is not the linear's output shape {tuple(linear_out)}: the epilogue adds "
                "one residual value per output element")
    return None


def _arguments(relu: bool):
    def arguments(m: Match):
        b = m.bindings
        return (b["input"], b["weight"], b.get("bias"), 0.0 if relu else None, None, "none", b["residual"]), {}
    return arguments


def _rules():
    rules = []
    for nd in (False, True):
        linear = linear_nd if nd else _linear_2d
        shapes = (all_of(tensors(["input", "weight", "bias"]), linear_nd_shapes, output_dtype(torch.float32),
                         not_dequantized()) if nd else _LINEAR_CHECK)
        for bias in (True, False):
            for relu in (False, True):
                name = "linear" + ("_nd" if nd else "") + ("" if bias else "_no_bias") + "_residual" + (
                    "_relu" if relu else "")
                rules.append(Rule(name, _pattern(linear, bias, relu), LINEAR_ACT, _examples(nd, bias),
                                  all_of(shapes, tensors(["residual"]), _residual_shape), _arguments(relu),
                                  free_sizes=nd))
    return rules


LINEAR_RESIDUAL_RULES = _rules()
