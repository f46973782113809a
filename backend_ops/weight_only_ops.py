"""Weight-only quantized linear: the float linear of a model whose weights torchao quantized
(`IntxWeightOnlyConfig`, int8 per channel or int4 in groups), with the weight kept quantized
and dequantized in registers by the kernel (kernels/csrc/core/linear_qw.h).

    linear_qw(input, weight, scales, zero_points, bits, bias, activation, residual)
        = activation(linear(input, (q - zp) * scale, bias) + residual)

q is the weight's integer values: `weight` itself (int8 [N, K]) at 8 bits; at 4 bits `weight` is
uint8 [N, K / 2] as `pack_int4` lays it out (in each 32-column chunk, byte i holds q[i] + 8 in
its low nibble and q[16 + i] + 8 in its high nibble). scales are float32 [N, groups] (groups of
K / groups columns, 1 group: per channel); zero points None or int8 of the scales' shape. Each
step is a float32 operation on exact integer values, as torchao's `dequantize_affine` computes,
so the retrace to ATen gives the original program's numbers bit for bit.

The rules (patterns/weight_only_rules.py) write `pack_int4(q)` into the graph at 4 bits;
`etfuse.fuse` and `transform(default_passes())` fold it into a packed constant
(passes/fold_packed_weights.py); in the `ExecutorchBackendConfig(passes=...)` route it stays and
runs per call.
"""

import torch

from .gemm_conv_ops import linear_epilogue, with_residual
from .registry import BackendOp, register

aten = torch.ops.aten
_CHUNK = 32  # columns per packed chunk (16 bytes)


def _pack_int4(weight):
    n = weight.shape[0]
    fields = aten.bitwise_and.Scalar(aten._to_copy.default(aten.add.Scalar(weight, 8), dtype=torch.uint8), 15)
    halves = aten.reshape.default(fields, [n, -1, 2, _CHUNK // 2])
    lo, hi = aten.select.int(halves, 2, 0), aten.select.int(halves, 2, 1)
    return aten.reshape.default(aten.bitwise_or.Tensor(lo, aten.bitwise_left_shift.Tensor_Scalar(hi, 4)), [n, -1])


def _unpack_int4(weight):
    """pack_int4's layout -> the integer values, float32 [N, K]."""
    n = weight.shape[0]
    chunks = aten.reshape.default(weight, [n, -1, _CHUNK // 2])
    lo, hi = aten.bitwise_and.Scalar(chunks, 15), aten.bitwise_right_shift.Tensor_Scalar(chunks, 4)
    q = aten.reshape.default(aten.cat.default([lo, hi], -1), [n, -1])
    return aten.sub.Tensor(aten._to_copy.default(q, dtype=torch.float32), 8.0)


def _linear_qw(input, weight, scales, zero_points, bits, bias=None, activation="none", residual=None):
    q = aten._to_copy.default(weight, dtype=torch.float32) if bits == 8 else _unpack_int4(weight)
    n, k = q.shape
    s = aten.reshape.default(scales, [n, -1])
    g = s.shape[1]
    q = aten.reshape.default(q, [n, g, k // g])
    if zero_points is not None:
        q = aten.sub.Tensor(q, aten._to_copy.default(aten.reshape.default(zero_points, [n, g, 1]), dtype=torch.float32))
    w = aten.reshape.default(aten.mul.Tensor(q, aten.reshape.default(s, [n, g, 1])), [n, k])
    return linear_epilogue(with_residual(aten.linear.default(input, w, bias), residual), None, None, activation)


LINEAR_QW = register(BackendOp(
    "etfuse",
    "linear_qw(Tensor input, Tensor weight, Tensor scales, Tensor? zero_points, int bits, Tensor? bias=None, "
    "str activation=\"none\", Tensor? residual=None) -> Tensor",
    _linear_qw,
    doc="activation(linear(input, (q - zero_points) * scales, bias) + residual); q int8 [N, K] (bits 8) or "
        "pack_int4's uint8 [N, K / 2] (bits 4); scales float32 [N, groups]; zero_points None or int8 like scales; "
        "the residual (a transformer's skip connection, the output's shape) is optional; a gated activation "
        "(swiglu, geglu, geglu_tanh) halves the output features as linear_act's does",
    kernel="linear_qw"))
PACK_INT4 = register(BackendOp(
    "etfuse", "pack_int4(Tensor weight) -> Tensor", _pack_int4,
    doc="int8 [N, K] values in [-8, 7] (K a multiple of 32) packed two per byte for linear_qw, uint8 [N, K / 2]",
    kernel="pack_int4"))

WEIGHT_ONLY_OPS = [LINEAR_QW, PACK_INT4]
