"""Normalisation backend ops: RMS norm as one pass instead of mul, mean, add, rsqrt, mul, mul."""

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

NORM_OPS = [RMS_NORM]
