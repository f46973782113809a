"""Normalisation backend ops: RMS norm as one pass instead of mul, mean, add, rsqrt, mul, mul;
layer norm over the last dim instead of the portable kernel's scalar loops."""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _rms_norm(input, weight=None, eps=1e-6):
    # llama's RMSNorm, in its order: normalise, then scale
    normed = aten.mul.Tensor(input, aten.rsqrt.default(aten.add.Scalar(
        aten.mean.dim(aten.mul.Tensor(input, input), [-1], True), eps)))
    return normed if weight is None else aten.mul.Tensor(normed, weight)


RMS_NORM = register(BackendOp(
    "etfuse", "rms_norm(Tensor input, Tensor? weight=None, float eps=1e-06) -> Tensor", _rms_norm,
    doc="input * rsqrt(mean(input^2 over the last dim) + eps) * weight, float32; weight [last dim] or None",
    kernel="rms_norm"))

def _layer_norm(input, weight=None, bias=None, eps=1e-5):
    # what the edge dialect makes of nn.LayerNorm / F.layer_norm over the last dim: the
    # normalised output of native_layer_norm (its mean and rstd outputs unused)
    return aten.native_layer_norm.default(input, [input.shape[-1]], weight, bias, eps)[0]


LAYER_NORM = register(BackendOp(
    "etfuse", "layer_norm(Tensor input, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    _layer_norm,
    doc="(input - mean) * rsqrt(var + eps) * weight + bias over the last dim (biased var), float32; weight and bias "
        "[last dim] or None",
    kernel="layer_norm"))

NORM_OPS = [RMS_NORM, LAYER_NORM]
