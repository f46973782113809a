"""GEMM and convolution backend ops with a clamp epilogue.

The activation is a clamp range: relu = [0, None], relu6 / hardtanh(0, 6) = [0, 6], none =
[None, None]. Each pattern computes exactly that with ATen ops, so a fused program retraces to
plain ATen.

| backend op          | pattern                                                     |
|---------------------|-------------------------------------------------------------|
| etfuse::conv2d_act  | clamp(conv2d(input, weight, bias, stride, padding, dilation, groups), min, max) |
| etfuse::linear_act  | clamp(linear(input, weight, bias), min, max)                |

(`etfuse::linear_relu`, from float_ops, stays the op for linear + relu.)
"""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _clamp(x, min, max):
    if min is None and max is None:
        return x
    return aten.clamp.default(x, min, max)


def _conv2d_act(input, weight, bias, stride, padding, dilation, groups, min=None, max=None):
    return _clamp(aten.conv2d.default(input, weight, bias, stride, padding, dilation, groups), min, max)


def _linear_act(input, weight, bias=None, min=None, max=None):
    return _clamp(aten.linear.default(input, weight, bias), min, max)


CONV2D_ACT = register(BackendOp(
    "etfuse",
    "conv2d_act(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, "
    "int groups, float? min=None, float? max=None) -> Tensor",
    _conv2d_act,
    doc="clamp(conv2d(...), min, max), NCHW float32; None bounds are open", kernel="conv2d_act"))
LINEAR_ACT = register(BackendOp(
    "etfuse",
    "linear_act(Tensor input, Tensor weight, Tensor? bias=None, float? min=None, float? max=None) -> Tensor",
    _linear_act,
    doc="clamp(input @ weight.T + bias, min, max), weight read as stored ([out, in])", kernel="linear_act"))

GEMM_CONV_OPS = [CONV2D_ACT, LINEAR_ACT]
