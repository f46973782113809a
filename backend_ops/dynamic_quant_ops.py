"""Dynamically quantized linear (8da4w, 8da8w): the linear of a model that torchao's
`Int8DynamicActivationIntxWeightConfig` quantized (executorch's llama export, `-qmode 8da4w`):
each input row quantized to int8 at run time (per token, asymmetric), the weight int8 per
channel or int4 in groups, as linear_qw holds it (backend_ops/weight_only_ops.py).

    linear_dq(input, weight, weight_row_sums, scales, zero_points, bits, bias, activation, residual)
        = linear_qw(quantize_per_token(input), weight, scales, zero_points, bits, bias, activation, residual)

quantize_per_token is torchao's `choose_qparams_affine(ASYMMETRIC, int8, eps = the smallest
normal float32) -> quantize_affine -> dequantize_affine` over the last dimension, written with
the same float32 steps, so the retrace to ATen gives the original program's numbers bit for bit.
The kernel (kernels/csrc/core/linear_dq.h) quantizes each row once, sums the integer products
exactly in int32 and applies the scales afterwards (float32 rounding of the scales' products).

weight_row_sums is `weight_row_sums(q, scales, zero_points)`: float32 [N], each dequantized weight
row's sum, sum_k (q - zp) * scale, computed at fuse time (the rules write it; `etfuse.fuse` folds it
into a constant beside the packed weight). The value is redundant (the pattern ignores it): it lets
a kernel take its integer dot products on the raw int8 activations qx (u8 x s8 `maddubs` on x86,
`sdot` on ARM64) and subtract the activation zero point's term, zx * row sum, once per output,
where per-group integer sums would stream one int32 beside every 32 weights.
"""

import torch

from .registry import BackendOp, register
from .weight_only_ops import _linear_qw

aten = torch.ops.aten
_EPS = torch.finfo(torch.float32).smallest_normal  # torchao's default eps for float32 inputs
_QMIN, _QMAX = -128, 127


def _quantize_per_token(x):
    """x's rows quantized to int8 and dequantized, each step torchao's (quant_primitives.py)."""
    lo = aten.clamp.default(aten.amin.default(x, [-1], True), None, 0.0)  # min(min_val, 0)
    hi = aten.clamp.default(aten.amax.default(x, [-1], True), 0.0)       # max(max_val, 0)
    scale = aten.clamp.default(aten.div.Tensor(aten.sub.Tensor(hi, lo), float(_QMAX - _QMIN)), _EPS)
    zp = aten.clamp.default(aten.rsub.Scalar(aten.round.default(aten.div.Tensor(lo, scale)), _QMIN), _QMIN, _QMAX)
    q = aten.add.Tensor(aten.round.default(aten.mul.Tensor(x, aten.reciprocal.default(scale))), zp)
    return aten.mul.Tensor(aten.sub.Tensor(aten.clamp.default(q, _QMIN, _QMAX), zp), scale)


def _linear_dq(input, weight, weight_row_sums, scales, zero_points, bits, bias=None, activation="none",
               residual=None):
    return _linear_qw(_quantize_per_token(input), weight, scales, zero_points, bits, bias, activation, residual)


LINEAR_DQ = register(BackendOp(
    "etfuse",
    "linear_dq(Tensor input, Tensor weight, Tensor weight_row_sums, Tensor scales, Tensor? zero_points, int bits, "
    "Tensor? bias=None, "
    "str activation=\"none\", Tensor? residual=None) -> Tensor",
    _linear_dq,
    doc="linear_qw over the input's rows quantized to int8 per token (asymmetric, torchao's choose_qparams_affine "
        "-> quantize_affine -> dequantize_affine); weight, scales, zero points, bias, activation and residual as "
        "linear_qw's; weight_row_sums is weight_row_sums of the weight (float32 [N], read by the kernel, ignored "
        "by the pattern); integer dot products in the kernel",
    kernel="linear_dq"))


def _weight_row_sums(weight, scales, zero_points):
    n = weight.shape[0]
    groups = scales.numel() // n
    g = weight.shape[1] // groups
    # each group's integer sum exact, then scaled and summed in float64, rounded once
    d = aten.sum.dim_IntList(aten.reshape.default(weight, [n, groups, g]), [-1], False, dtype=torch.float64)
    if zero_points is not None:
        zp = aten._to_copy.default(aten.reshape.default(zero_points, [n, groups]), dtype=torch.float64)
        d = aten.sub.Tensor(d, aten.mul.Scalar(zp, g))
    s = aten._to_copy.default(aten.reshape.default(scales, [n, groups]), dtype=torch.float64)
    return aten._to_copy.default(aten.sum.dim_IntList(aten.mul.Tensor(d, s), [-1]), dtype=torch.float32)


WEIGHT_ROW_SUMS = register(BackendOp(
    "etfuse", "weight_row_sums(Tensor weight, Tensor scales, Tensor? zero_points) -> Tensor", _weight_row_sums,
    doc="int8 [N, K] with scales (and int8 zero points) [N, groups] -> float32 [N]: each dequantized row's sum, "
        "sum_k (q - zp) * scale (linear_dq's weight_row_sums)",
    kernel="weight_row_sums"))

DYNAMIC_QUANT_OPS = [LINEAR_DQ, WEIGHT_ROW_SUMS]
