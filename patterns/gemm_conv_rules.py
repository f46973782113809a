"""GEMM and convolution fusions: a linear or conv2d absorbs the bias, the activation and the
weight transpose, so the stock runtime's slow convolution / permute_copy + addmm never run.

| rule                  | edge pattern                                                  | backend op         |
|-----------------------|---------------------------------------------------------------|--------------------|
| conv2d_relu           | relu(convolution(x, w, b, stride, padding, dilation, groups)) | etfuse::conv2d_act |
| conv2d_hardtanh       | hardtanh(convolution(...), lo, hi)         (relu6 = 0, 6)     | etfuse::conv2d_act |
| conv2d_clamp          | clamp(convolution(...), lo, hi)                               | etfuse::conv2d_act |
| conv2d                | convolution(...)                                              | etfuse::conv2d_act |
| linear_relu           | relu(addmm(b, x, permute_copy(w)))                            | etfuse::linear_relu|
| linear_relu_no_bias   | relu(mm(x, permute_copy(w)))                                  | etfuse::linear_relu|
| linear_hardtanh(_no_bias) | hardtanh(addmm(b, x, permute_copy(w)) / mm(...), lo, hi)  | etfuse::linear_act |
| linear_clamp(_no_bias)    | clamp(addmm(...) / mm(...), lo, hi)                       | etfuse::linear_act |
| linear(_no_bias)      | addmm(b, x, permute_copy(w)) / mm(x, permute_copy(w))         | etfuse::linear_act |
| conv2d_bn[_relu/_hardtanh/_clamp] | act(bn(convolution(...)))  (bn: `_native_batch_norm_legit_no_training(...)[0]`) | etfuse::conv2d_bn_act |
| linear_bn[...][_no_bias] | act(bn(addmm(...) / mm(...)))                             | etfuse::linear_bn_act |
| conv1d[_bn][_relu/_hardtanh/_clamp] | act([bn](convolution(x, w, b, [s], [p], [d], groups)))  | squeeze(conv2d[_bn]_act(unsqueeze(x), unsqueeze(w), ...)) |

`convolution` here is the 2-D, non-transposed one (`transposed=False`, `output_padding=[0, 0]`
are literals of the pattern; conv1d/conv3d have other list lengths and never match them). A
1-D convolution is the 2-D one on a height-1 image: the conv1d rules' replacement is a function
that adds the unit dimension to input and weight, runs the 2-D kernel (with the same epilogues
and batch norm) and drops the dimension again. An eval
batch norm between the convolution / linear and its activation becomes the kernel's per-channel
epilogue (the `*_bn_act` ops: no weights rewritten, so every route gives the same program); a
residual `relu(add(conv(x), skip))` is conv_residual_rules.py's (the add in the conv's epilogue).
"""

from __future__ import annotations

import inspect
import math

import torch

from etfuse.backend_ops.float_ops import LINEAR_RELU
from etfuse.backend_ops.gemm_conv_ops import (ACTIVATIONS, CONV2D_ACT, CONV2D_BN_ACT, LINEAR_ACT, LINEAR_BN_ACT,
                                              activation_pattern)

from .constraints import all_of, int_scalars, not_dequantized, output_dtype, ranks, tensors
from .rule import Match, Rule

aten = torch.ops.aten
F32 = (torch.float32,)

# Example scalars: each scalar parameter of a pattern needs a value no other one has.
# (Not 0 or 6: the hard activations' patterns hold those as literals.)
_CONV_SCALARS = dict(s0=2, s1=3, p0=4, p1=5, d0=9, d1=7, groups=8)
_LO, _HI = -2.5, 3.5
# Activations the kernels apply after the GEMM (the op's `activation` argument), not clamps.
_UNARY = tuple(a for a in ACTIVATIONS if a != "none")
# Activations the edge dialect decomposes with lifted tensor constants (3 and 6): their patterns
# take the two constants as parameters where the clamp patterns take lo and hi, and match only
# when their values are 3 and 6 (`Match.constant`: the program's constants, or the value a
# lifted constant's fake tensor carries, so a graph module alone works too; unknown: no match).
_HARD = ("hardswish", "hardsigmoid")
_HARD_CONSTANTS = (3, 6)  # int64 0-dim constants, cast to float32 in the graph


def _hard_activation(act: str, x, three, six):
    """F.hardswish / F.hardsigmoid as the edge dialect spells them."""
    def f32(c):
        return aten._to_copy.default(c, dtype=torch.float32)

    gate = aten.clamp.default(aten.clamp.default(aten.add.Tensor(x, f32(three)), 0), None, 6)
    if act == "hardswish":
        return aten.div.Tensor(aten.mul.Tensor(x, gate), f32(six))
    return aten.div.Tensor(gate, f32(six))


def _act_examples(act: str) -> tuple:
    """Example inputs for the activation's own pattern parameters (the hard ones' constants)."""
    return tuple(torch.tensor(c, dtype=torch.int64) for c in _HARD_CONSTANTS) if act in _HARD else ()


def _named_for(act: str, pattern):
    """A hard activation's pattern reads its constants where the clamp patterns read lo and hi:
    the parameters are renamed, so bindings (and reports) say `three` and `six`."""
    if act not in _HARD:
        return pattern
    sig = inspect.signature(pattern)
    names = {"lo": "three", "hi": "six"}
    pattern.__signature__ = sig.replace(
        parameters=[p.replace(name=names.get(p.name, p.name)) for p in sig.parameters.values()])
    return pattern


def _checked(check, act: str):
    """The rule's constraint, and for a hard activation the check of its constants."""
    return all_of(check, _hard_constants(act)) if act in _HARD else check


def _hard_constants(act: str):
    """The constants a hard activation's pattern bound are 3 and 6, as values the program holds."""
    def check(m: Match):
        for name, want in zip(("three", "six"), _HARD_CONSTANTS):
            value = m.constant(name)
            if value is None:
                return f"the {act} constant {name} has no known value (a graph module alone carries none)"
            if value.numel() != 1 or float(value.reshape(())) != want:
                return f"the {act} constant {name} is {value.tolist()!r}, not {want}"
        return None

    return check


def _fresh(values) -> tuple:
    """Example inputs as new objects per call (see _batch_norm_rules)."""
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in values)


def _conv_inputs(*act_scalars):
    return lambda: (torch.randn(1, 8, 40, 40), torch.randn(16, 1, 3, 3), torch.randn(16),
                    *_CONV_SCALARS.values(), *_fresh(act_scalars))


def _conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups):
    return aten.convolution.default(input, weight, bias, [s0, s1], [p0, p1], [d0, d1], False, [0, 0], groups)


def _conv2d(input, weight, bias, s0, s1, p0, p1, d0, d1, groups):
    return _conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups)


def _conv2d_relu(input, weight, bias, s0, s1, p0, p1, d0, d1, groups):
    return aten.relu.default(_conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups))


def _conv2d_hardtanh(input, weight, bias, s0, s1, p0, p1, d0, d1, groups, lo, hi):
    return aten.hardtanh.default(_conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups), lo, hi)


def _conv2d_clamp(input, weight, bias, s0, s1, p0, p1, d0, d1, groups, lo, hi):
    return aten.clamp.default(_conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups), lo, hi)


def _conv2d_unary(act: str):
    def pattern(input, weight, bias, s0, s1, p0, p1, d0, d1, groups, lo=None, hi=None):
        return _activation(act, _conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups), lo, hi)

    return _named_for(act, pattern)


def _linear_unary(act: str, bias: bool):
    if bias:
        def pattern(input, weight, bias, lo=None, hi=None):
            return _activation(act, aten.linear.default(input, weight, bias), lo, hi)
    else:
        def pattern(input, weight, lo=None, hi=None):
            return _activation(act, aten.linear.default(input, weight), lo, hi)
    return _named_for(act, pattern)


def _linear(input, weight, bias):
    return aten.linear.default(input, weight, bias)


def _linear_no_bias(input, weight):
    return aten.linear.default(input, weight)


def _linear_relu(input, weight, bias):
    return aten.relu.default(aten.linear.default(input, weight, bias))


def _linear_relu_no_bias(input, weight):
    return aten.relu.default(aten.linear.default(input, weight))


def _linear_hardtanh(input, weight, bias, lo, hi):
    return aten.hardtanh.default(aten.linear.default(input, weight, bias), lo, hi)


def _linear_hardtanh_no_bias(input, weight, lo, hi):
    return aten.hardtanh.default(aten.linear.default(input, weight), lo, hi)


def _linear_clamp(input, weight, bias, lo, hi):
    return aten.clamp.default(aten.linear.default(input, weight, bias), lo, hi)


def _linear_clamp_no_bias(input, weight, lo, hi):
    return aten.clamp.default(aten.linear.default(input, weight), lo, hi)


# ---- what each activation means as a clamp range [min, max] (None: open) -------------------

def _bound(v):
    return None if v is None else float(v)


def _act_range(m: Match, act: str):
    if act == "none" or act in _UNARY:
        return None, None
    if act == "relu":
        return 0.0, None
    return _bound(m.bindings["lo"]), _bound(m.bindings["hi"])


def _unary_argument(act: str) -> tuple:
    """The op's trailing `activation` argument: given only when it is not "none"."""
    return (act,) if act in _UNARY else ()


# ---- constraints ---------------------------------------------------------------------------

def _scalar_bounds(m: Match):
    for name in ("lo", "hi"):
        v = m.bindings.get(name)
        if v is not None and (isinstance(v, torch.fx.Node) or isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{name} is {v!r}, not a constant number"
        if v is not None and math.isnan(float(v)):
            return f"{name} is NaN"
    lo, hi = m.bindings.get("lo"), m.bindings.get("hi")
    if lo is not None and hi is not None and float(lo) > float(hi):
        return f"min {lo} > max {hi}: hardtanh/clamp differ there; the kernel clamps to [min, max]"
    return None


def _conv_bias(m: Match):
    if m.bindings.get("bias") is not None:
        b, w = m.value("bias"), m.value("weight")
        if b.dim() != 1 or b.shape[0] != w.shape[0]:
            return f"bias has shape {tuple(b.shape)}; the kernel takes [{w.shape[0]}]"
    return None


_CONV_CHECK = all_of(
    tensors(["input", "weight", "bias"], F32, optional=["bias"]), ranks(input=4, weight=4),
    int_scalars(_CONV_SCALARS), _conv_bias, _scalar_bounds, output_dtype(torch.float32))
_LINEAR_CHECK = all_of(
    tensors(["input", "weight", "bias"], F32), ranks(input=2, weight=2, bias=1), _scalar_bounds,
    output_dtype(torch.float32), not_dequantized())


# ---- replacement arguments -----------------------------------------------------------------

def _conv_arguments(act: str):
    def arguments(m: Match):
        b = m.bindings
        lo, hi = _act_range(m, act)
        return (b["input"], b["weight"], b.get("bias"), [b["s0"], b["s1"]], [b["p0"], b["p1"]],
                [b["d0"], b["d1"]], b["groups"], lo, hi, *_unary_argument(act)), {}

    return arguments


def _linear_arguments(act: str):
    def arguments(m: Match):
        b = m.bindings
        if act == "relu":
            return (b["input"], b["weight"], b.get("bias")), {}
        lo, hi = _act_range(m, act)
        return (b["input"], b["weight"], b.get("bias"), lo, hi, *_unary_argument(act)), {}

    return arguments


def _linear_inputs(bias: bool, *act_scalars):
    return lambda: (torch.randn(4, 8), torch.randn(16, 8), *((torch.randn(16),) if bias else ()), *_fresh(act_scalars))


def _rules():
    rules = []
    for act, pattern, extra in (
        ("relu", _conv2d_relu, ()), ("hardtanh", _conv2d_hardtanh, (_LO, _HI)),
        ("clamp", _conv2d_clamp, (_LO, _HI)), ("none", _conv2d, ()),
    ):
        name = "conv2d" if act == "none" else f"conv2d_{act}"
        rules.append(Rule(name, pattern, CONV2D_ACT, _conv_inputs(*extra), _CONV_CHECK, _conv_arguments(act)))
    for act in _UNARY:
        rules.append(Rule(f"conv2d_{act}", _conv2d_unary(act), CONV2D_ACT, _conv_inputs(*_act_examples(act)),
                          _checked(_CONV_CHECK, act), _conv_arguments(act)))
        for with_bias in (True, False):
            rules.append(Rule(f"linear_{act}" + ("" if with_bias else "_no_bias"), _linear_unary(act, with_bias),
                              LINEAR_ACT, _linear_inputs(with_bias, *_act_examples(act)),
                              _checked(_LINEAR_CHECK, act), _linear_arguments(act)))
    for act, with_bias, no_bias, extra in (
        ("relu", _linear_relu, _linear_relu_no_bias, ()),
        ("hardtanh", _linear_hardtanh, _linear_hardtanh_no_bias, (_LO, _HI)),
        ("clamp", _linear_clamp, _linear_clamp_no_bias, (_LO, _HI)),
        ("none", _linear, _linear_no_bias, ()),
    ):
        op = LINEAR_RELU if act == "relu" else LINEAR_ACT
        name = "linear" if act == "none" else f"linear_{act}"
        # relu(addmm(b, x, permute_copy(w))) is also float_rules' addmm_relu: the linear reads the
        # weight as stored, so it wins (it would anyway, being larger; `outranks` says it).
        outranks = ("addmm_relu",) if act == "relu" else ()
        rules.append(Rule(name, with_bias, op, _linear_inputs(True, *extra), _LINEAR_CHECK, _linear_arguments(act),
                          outranks=outranks))
        rules.append(Rule(f"{name}_no_bias", no_bias, op, _linear_inputs(False, *extra), _LINEAR_CHECK,
                          _linear_arguments(act)))
    rules.extend(_batch_norm_rules())
    rules.extend(_conv1d_rules())
    return rules


# ---- batch norm (eval) after a convolution / linear: the *_bn_act ops ------------------------
# The edge dialect's eval batch norm is `_native_batch_norm_legit_no_training(...)[0]`; its
# momentum does nothing in eval mode, so any value matches.
_BN_SCALARS = dict(momentum=0.375, eps=0.0625)  # example values no other scalar of the rule has


def _bn(x, bn_weight, bn_bias, running_mean, running_var, momentum, eps):
    return aten._native_batch_norm_legit_no_training.default(
        x, bn_weight, bn_bias, running_mean, running_var, momentum, eps)[0]


def _activation(act: str, x, lo=None, hi=None):
    if act == "relu":
        return aten.relu.default(x)
    if act == "hardtanh":
        return aten.hardtanh.default(x, lo, hi)
    if act == "clamp":
        return aten.clamp.default(x, lo, hi)
    if act in _HARD:  # lo and hi are the constants 3 and 6 here (_named_for)
        return _hard_activation(act, x, lo, hi)
    return activation_pattern(x, act)


def _conv2d_bn_pattern(act: str):
    def pattern(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, s0, s1, p0, p1, d0, d1, groups,
                momentum, eps, lo=None, hi=None):
        conv = _conv(input, weight, bias, s0, s1, p0, p1, d0, d1, groups)
        return _activation(act, _bn(conv, bn_weight, bn_bias, running_mean, running_var, momentum, eps), lo, hi)

    return _named_for(act, pattern)


def _linear_bn_pattern(act: str, bias: bool):
    if bias:
        def pattern(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, momentum, eps, lo=None,
                    hi=None):
            linear = aten.linear.default(input, weight, bias)
            return _activation(act, _bn(linear, bn_weight, bn_bias, running_mean, running_var, momentum, eps), lo, hi)
    else:
        def pattern(input, weight, bn_weight, bn_bias, running_mean, running_var, momentum, eps, lo=None, hi=None):
            linear = aten.linear.default(input, weight)
            return _activation(act, _bn(linear, bn_weight, bn_bias, running_mean, running_var, momentum, eps), lo, hi)
    return _named_for(act, pattern)


def _bn_stats(channels: int):
    return (torch.rand(channels) + 0.5, torch.randn(channels), torch.randn(channels), torch.rand(channels) + 0.5)


def _bn_scalars(m: Match):
    for name in _BN_SCALARS:
        v = m.bindings[name]
        if isinstance(v, torch.fx.Node) or isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{name} is {v!r}, not a constant number"
    return None


def _bn_channels(m: Match):
    channels = m.value("weight").shape[0]
    for name in ("bn_weight", "bn_bias", "running_mean", "running_var"):
        if m.bindings.get(name) is not None and tuple(m.value(name).shape) != (channels,):
            return f"{name} has shape {tuple(m.value(name).shape)}; the kernel takes [{channels}]"
    return None


_BN_TENSORS = tensors(["bn_weight", "bn_bias", "running_mean", "running_var"], F32, optional=["bn_weight", "bn_bias"])
_CONV_BN_CHECK = all_of(_CONV_CHECK, _BN_TENSORS, _bn_scalars, _bn_channels)
_LINEAR_BN_CHECK = all_of(_LINEAR_CHECK, _BN_TENSORS, _bn_scalars, _bn_channels)


def _bn_arguments(m: Match) -> tuple:
    b = m.bindings
    return (b.get("bn_weight"), b.get("bn_bias"), b["running_mean"], b["running_var"], float(b["eps"]))


def _conv2d_bn_arguments(act: str):
    def arguments(m: Match):
        b = m.bindings
        lo, hi = _act_range(m, act)
        return (b["input"], b["weight"], b.get("bias"), *_bn_arguments(m), [b["s0"], b["s1"]], [b["p0"], b["p1"]],
                [b["d0"], b["d1"]], b["groups"], lo, hi, *_unary_argument(act)), {}

    return arguments


def _linear_bn_arguments(act: str):
    def arguments(m: Match):
        b = m.bindings
        lo, hi = _act_range(m, act)
        return (b["input"], b["weight"], b.get("bias"), *_bn_arguments(m), lo, hi, *_unary_argument(act)), {}

    return arguments


def _batch_norm_rules():
    rules = []
    # the activation's own example inputs, made afresh per call: one tensor object given to
    # two patterns would become one shared input when the table is traced in one export
    acts = (("relu", ()), ("hardtanh", (_LO, _HI)), ("clamp", (_LO, _HI)), ("none", ()))
    for act, extra in (*acts, *((a, None) for a in _UNARY)):
        suffix = "" if act == "none" else f"_{act}"
        conv_inputs = _conv_inputs()

        def act_inputs(extra=extra, act=act):
            return _fresh(extra) if extra is not None else _act_examples(act)

        rules.append(Rule(
            f"conv2d_bn{suffix}", _conv2d_bn_pattern(act), CONV2D_BN_ACT,
            lambda act_inputs=act_inputs, conv_inputs=conv_inputs: (
                *conv_inputs()[:3], *_bn_stats(16), *_CONV_SCALARS.values(), *_BN_SCALARS.values(), *act_inputs()),
            _checked(_CONV_BN_CHECK, act), _conv2d_bn_arguments(act)))
        for with_bias in (True, False):
            rules.append(Rule(
                f"linear_bn{suffix}" + ("" if with_bias else "_no_bias"), _linear_bn_pattern(act, with_bias),
                LINEAR_BN_ACT,
                lambda act_inputs=act_inputs, with_bias=with_bias: (
                    *_linear_inputs(with_bias)(), *_bn_stats(16), *_BN_SCALARS.values(), *act_inputs()),
                _checked(_LINEAR_BN_CHECK, act), _linear_bn_arguments(act)))
    return rules



# ---- conv1d: the conv2d kernels on [N, C, 1, L] ---------------------------------------------
# Not 0, 1 or 2: the replacement's own literals (unsqueeze at 2, stride 1, padding 0) would be
# taken for these parameters (scalars are found by their example value).
_CONV1D_SCALARS = dict(s=3, p=5, d=4, groups=9)


def _conv1d(input, weight, bias, s, p, d, groups):
    return aten.convolution.default(input, weight, bias, [s], [p], [d], False, [0], groups)


def _conv1d_pattern(act: str, bn: bool):
    def pattern(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, s, p, d, groups, momentum, eps,
                lo=None, hi=None):
        y = _conv1d(input, weight, bias, s, p, d, groups)
        if bn:
            y = _bn(y, bn_weight, bn_bias, running_mean, running_var, momentum, eps)
        return _activation(act, y, lo, hi)

    def plain(input, weight, bias, s, p, d, groups, lo=None, hi=None):
        return _activation(act, _conv1d(input, weight, bias, s, p, d, groups), lo, hi)

    return pattern if bn else plain


def _conv1d_replacement(act: str, bn: bool):
    def clamp_range(lo, hi):
        return {"relu": (0.0, None), "none": (None, None)}.get(act, (lo, hi))

    def replacement(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, s, p, d, groups, momentum,
                    eps, lo=None, hi=None):
        x, w = aten.unsqueeze.default(input, 2), aten.unsqueeze.default(weight, 2)
        y = torch.ops.etfuse.conv2d_bn_act.default(x, w, bias, bn_weight, bn_bias, running_mean, running_var, eps,
                                                   [1, s], [0, p], [1, d], groups, *clamp_range(lo, hi))
        return aten.squeeze.dim(y, 2)

    def plain(input, weight, bias, s, p, d, groups, lo=None, hi=None):
        x, w = aten.unsqueeze.default(input, 2), aten.unsqueeze.default(weight, 2)
        y = torch.ops.etfuse.conv2d_act.default(x, w, bias, [1, s], [0, p], [1, d], groups, *clamp_range(lo, hi))
        return aten.squeeze.dim(y, 2)

    return replacement if bn else plain


_CONV1D_CHECK = all_of(
    tensors(["input", "weight", "bias"], F32, optional=["bias"]), ranks(input=3, weight=3),
    int_scalars(_CONV1D_SCALARS), _conv_bias, _scalar_bounds, output_dtype(torch.float32))


def _conv1d_rules():
    rules = []
    for bn in (True, False):
        for act, extra in (("relu", ()), ("hardtanh", (_LO, _HI)), ("clamp", (_LO, _HI)), ("none", ())):
            name = "conv1d" + ("_bn" if bn else "") + ("" if act == "none" else f"_{act}")
            tensors_ = (torch.randn(1, 9, 40), torch.randn(18, 1, 3), torch.randn(18), *(_bn_stats(18) if bn else ()))
            scalars = (*_CONV1D_SCALARS.values(), *(_BN_SCALARS.values() if bn else ()), *extra)
            check = all_of(_CONV1D_CHECK, _BN_TENSORS, _bn_scalars, _bn_channels) if bn else _CONV1D_CHECK
            rules.append(Rule(name, _conv1d_pattern(act, bn), _conv1d_replacement(act, bn),
                              lambda tensors_=tensors_, scalars=scalars: (*tensors_, *scalars), check))
    return rules


GEMM_CONV_RULES = _rules()
