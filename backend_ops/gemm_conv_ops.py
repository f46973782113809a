"""GEMM and convolution backend ops with a clamp epilogue.

The activation is a clamp range: relu = [0, None], relu6 / hardtanh(0, 6) = [0, 6], none =
[None, None]; then `activation`, one of "none", "silu" (x * sigmoid(x)), "sigmoid", "gelu"
(erf), "gelu_tanh", "hardswish" (x * clamp(x + 3, 0, 6) / 6) and "hardsigmoid"
(clamp(x + 3, 0, 6) / 6), which the kernels apply to the output right after the GEMM. Each pattern
computes exactly that with ATen ops, so a fused program retraces to plain ATen.

| backend op          | pattern                                                     |
|---------------------|-------------------------------------------------------------|
| etfuse::conv2d_act  | act(clamp(conv2d(input, weight, bias, stride, padding, dilation, groups) [+ residual], min, max)) |
| etfuse::linear_act  | act(clamp(linear(input, weight, bias) [+ residual], min, max)) |

A linear's `activation` may also be gated (GATED_ACTIVATIONS: "swiglu", "geglu", "geglu_tanh"):
`inner(y[..., :h]) * y[..., h:]` of its 2h output features, the SwiGLU of a llama MLP as one linear
over w1 and w3 concatenated (passes/gated_linears.py).

(`etfuse::linear_relu`, from float_ops, stays the op for linear + relu.)
"""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


ACTIVATIONS = ("none", "silu", "sigmoid", "gelu", "gelu_tanh", "hardswish", "hardsigmoid")
# The linears' gated activations: the inner activation of the first half of the output features
# times the second half (SwiGLU / GeGLU: one linear over the two weights concatenated).
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def _clamp(x, min, max):
    if min is None and max is None:
        return x
    return aten.clamp.default(x, min, max)


def activation_pattern(x, activation: str):
    """`activation` (one of ACTIVATIONS) as the edge dialect spells it; the rules use it too."""
    if activation == "none":
        return x
    if activation == "silu":  # as the edge dialect spells F.silu
        return aten.mul.Tensor(x, aten.sigmoid.default(x))
    if activation == "sigmoid":
        return aten.sigmoid.default(x)
    if activation == "gelu":
        return aten.gelu.default(x)
    if activation == "gelu_tanh":
        return aten.gelu.default(x, approximate="tanh")
    if activation == "hardswish":  # the edge dialect decomposes it (patterns/gemm_conv_rules.py)
        return aten.hardswish.default(x)
    if activation == "hardsigmoid":
        return aten.hardsigmoid.default(x)
    raise ValueError(f"unknown activation {activation!r}; one of {', '.join(ACTIVATIONS)}")


def _epilogue(x, min, max, activation):
    return activation_pattern(_clamp(x, min, max), activation)


def linear_epilogue(x, min, max, activation):
    """A linear's epilogue: `_epilogue`, or a gated activation (GATED_ACTIVATIONS) of the clamped
    features, `inner(x[..., :h]) * x[..., h:]`, which halves the last dimension."""
    if activation not in GATED_ACTIVATIONS:
        return _epilogue(x, min, max, activation)
    x = _clamp(x, min, max)
    h = x.shape[-1] // 2
    if x.shape[-1] != 2 * h:
        raise ValueError(f"the gated activation {activation!r} needs an even number of output features, "
                         f"got {x.shape[-1]}")
    first, second = aten.slice.Tensor(x, -1, 0, h), aten.slice.Tensor(x, -1, h, 2 * h)
    return aten.mul.Tensor(activation_pattern(first, GATED_ACTIVATIONS[activation]), second)


def with_residual(x, residual):
    """The residual epilogue of linear_act and the conv2d ops: `residual` (the output's shape, or None)
    added before the clamp."""
    return x if residual is None else aten.add.Tensor(x, residual)


def _conv2d_act(input, weight, bias, stride, padding, dilation, groups, min=None, max=None, activation="none",
                residual=None):
    conv = aten.conv2d.default(input, weight, bias, stride, padding, dilation, groups)
    return _epilogue(with_residual(conv, residual), min, max, activation)


def _linear_act(input, weight, bias=None, min=None, max=None, activation="none", residual=None):
    return linear_epilogue(with_residual(aten.linear.default(input, weight, bias), residual), min, max, activation)


CONV2D_ACT = register(BackendOp(
    "etfuse",
    "conv2d_act(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, "
    "int groups, float? min=None, float? max=None, str activation=\"none\", Tensor? residual=None) -> Tensor",
    _conv2d_act,
    doc="activation(clamp(conv2d(...) + residual, min, max)), NCHW float32; None bounds are open; the residual (a "
        "residual block's skip connection, the output's shape) is optional",
    kernel="conv2d_act"))
LINEAR_ACT = register(BackendOp(
    "etfuse",
    "linear_act(Tensor input, Tensor weight, Tensor? bias=None, float? min=None, float? max=None, "
    "str activation=\"none\", Tensor? residual=None) -> Tensor",
    _linear_act,
    doc="activation(clamp(input @ weight.T + bias + residual, min, max)), weight read as stored ([out, in]); the "
        "residual (a transformer's skip connection, the output's shape) is optional; a gated activation (swiglu, "
        "geglu, geglu_tanh: act(y[..., :h]) * y[..., h:]) halves the 2h output features",
    kernel="linear_act"))



# Batch norm (eval) after a convolution / linear, applied in the kernel's epilogue: the kernel
# turns the statistics into one scale and shift per output channel (O(channels) per call), so
# the op is as fast as conv2d_act / linear_act on the folded weights, in every route, including
# `to_executorch(passes=...)`, where a pass only sees the graph module and cannot fold weights.
def _batch_norm(x, bn_weight, bn_bias, running_mean, running_var, eps):
    # the momentum (0.1) does not affect eval mode
    return aten._native_batch_norm_legit_no_training.default(
        x, bn_weight, bn_bias, running_mean, running_var, 0.1, eps)[0]


def _conv2d_bn_act(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding,
                   dilation, groups, min=None, max=None, activation="none", residual=None):
    conv = aten.conv2d.default(input, weight, bias, stride, padding, dilation, groups)
    normed = _batch_norm(conv, bn_weight, bn_bias, running_mean, running_var, eps)
    return _epilogue(with_residual(normed, residual), min, max, activation)


def _linear_bn_act(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, min=None, max=None,
                   activation="none"):
    linear = aten.linear.default(input, weight, bias)
    return _epilogue(_batch_norm(linear, bn_weight, bn_bias, running_mean, running_var, eps), min, max, activation)


_BN_ARGS = "Tensor? bn_weight, Tensor? bn_bias, Tensor running_mean, Tensor running_var, float eps"
CONV2D_BN_ACT = register(BackendOp(
    "etfuse",
    f"conv2d_bn_act(Tensor input, Tensor weight, Tensor? bias, {_BN_ARGS}, int[2] stride, int[2] padding, "
    "int[2] dilation, int groups, float? min=None, float? max=None, str activation=\"none\", Tensor? residual=None) "
    "-> Tensor",
    _conv2d_bn_act,
    doc="activation(clamp(batch_norm_eval(conv2d(...)) + residual, min, max)), NCHW float32; the batch norm is a "
        "per-channel epilogue, the residual optional",
    kernel="conv2d_bn_act"))
LINEAR_BN_ACT = register(BackendOp(
    "etfuse",
    f"linear_bn_act(Tensor input, Tensor weight, Tensor? bias, {_BN_ARGS}, float? min=None, float? max=None, "
    "str activation=\"none\") -> Tensor",
    _linear_bn_act,
    doc="activation(clamp(batch_norm_eval(input @ weight.T + bias), min, max)), input [N, in]; the batch norm is "
        "a per-feature epilogue",
    kernel="linear_bn_act"))

GEMM_CONV_OPS = [CONV2D_ACT, LINEAR_ACT, CONV2D_BN_ACT, LINEAR_BN_ACT]
