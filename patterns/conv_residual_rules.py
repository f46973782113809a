"""A convolution's residual add: a ResNet block's `relu(bn(conv(h)) + x)` (and MobileNetV2's
`x + bn(conv(h))`, no relu) as one `etfuse::conv2d_[bn_]act` with its residual epilogue. The kernel
adds x where it writes the conv's output tile, so the add is not a pass over memory of its own:
on two threads a separate add read most of its operands out of the other core's cache (ResNet8's
three add_relus: 12, 7 and 4 us, 2, 1.2 and 0.7 on one thread).

| rule                          | edge pattern                                            | backend op            |
|-------------------------------|---------------------------------------------------------|-----------------------|
| conv2d_residual[_relu]        | [relu](add(convolution(x, w, b, ...), r))  (commutative) | etfuse::conv2d_act    |
| conv2d_bn_residual[_relu]     | [relu](add(bn(convolution(...)), r))       (commutative) | etfuse::conv2d_bn_act |

The add must be exactly the residual add: alpha 1, r of the conv's output shape (no broadcasting:
a per-channel add is a bias). Both operands of `add` may be convolutions (a block with a 1x1
shortcut conv): the larger pattern, the one with the batch norm, is tried first, and the other
conv stays a conv2d_act of its own that computes r.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from etfuse.backend_ops import CONV2D_ACT, CONV2D_BN_ACT

from .constraints import all_of, tensors
from .gemm_conv_rules import (_BN_SCALARS, _CONV_BN_CHECK, _CONV_CHECK, _CONV_SCALARS, _bn, _bn_stats, _conv,
                              _conv2d_bn_arguments, _conv_arguments, _conv_inputs)
from .linear_residual_rules import _dims
from .rule import Match, Rule

aten = torch.ops.aten


def _finish(y, residual, relu: bool):
    y = aten.add.Tensor(y, residual)
    return aten.relu.default(y) if relu else y


def _conv_pattern(relu: bool):
    def pattern(input, weight, bias, s0, s1, p0, p1, d0, d1, groups, residual):
        return _finish(_conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups), residual, relu)

    return pattern


def _conv_bn_pattern(relu: bool):
    def pattern(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, s0, s1, p0, p1, d0, d1, groups,
                momentum, eps, residual):
        conv = _conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups)
        return _finish(_bn(conv, bn_weight, bn_bias, running_mean, running_var, momentum, eps), residual, relu)

    return pattern


def _residual_example(x, w):
    """A residual of the example conv's output shape."""
    s = _CONV_SCALARS
    out = F.conv2d(x, w, None, (s["s0"], s["s1"]), (s["p0"], s["p1"]), (s["d0"], s["d1"]), s["groups"])
    return torch.randn(out.shape)


def _conv_examples():
    x, w, b, *scalars = _conv_inputs()()
    return (x, w, b, *scalars, _residual_example(x, w))


def _conv_bn_examples():
    x, w, b, *scalars = _conv_inputs()()
    return (x, w, b, *_bn_stats(w.shape[0]), *scalars, *_BN_SCALARS.values(), _residual_example(x, w))


def _residual_shape(m: Match):
    """r is the add's output shape, which is the conv's: the add broadcasts nothing."""
    r, out = m.value("residual"), m.anchor_value
    if _dims(r.shape) != _dims(out.shape):
        return (f"residual {tuple(r.shape)} is not the conv's output shape {tuple(out.shape)}: the epilogue adds "
                "one residual value per output element")
    return None


def _arguments(bn: bool, relu: bool):
    conv_arguments = (_conv2d_bn_arguments if bn else _conv_arguments)("none")  # ..., groups, min, max

    def arguments(m: Match):
        args, _ = conv_arguments(m)
        return (*args[:-2], 0.0 if relu else None, None, "none", m.bindings["residual"]), {}

    return arguments


def _rules():
    rules = []
    for bn in (False, True):
        for relu in (False, True):
            name = "conv2d" + ("_bn" if bn else "") + "_residual" + ("_relu" if relu else "")
            pattern = _conv_bn_pattern(relu) if bn else _conv_pattern(relu)
            check = all_of(_CONV_BN_CHECK if bn else _CONV_CHECK, tensors(["residual"]), _residual_shape)
            rules.append(Rule(name, pattern, CONV2D_BN_ACT if bn else CONV2D_ACT,
                              _conv_bn_examples if bn else _conv_examples, check, _arguments(bn, relu)))
    return rules


CONV_RESIDUAL_RULES = _rules()
