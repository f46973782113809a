"""Quantized conv2d and linear: what PT2E (the XNNPACK quantizer) leaves around every conv/linear,

    quantize(act(conv2d(dequantize(x), dequantize_per_channel(w), bias)))

as one op that reads int8/uint8 activations and an int8 weight, accumulates in integers and
requantizes in its epilogue, so the dequantize/quantize pairs between two fused ops disappear
(the output is the next op's quantized input).

The ops' semantics (their patterns, so a fused program retraces to plain ATen) accumulate the
integers exactly, the way int8 hardware does:

    acc[c]   = sum (float(x) - x_zp) * (float(w[c]) - w_zp[c])          (an exact integer)
    y[c]     = acc[c] * float32(input_scale * weight_scale[c]) + bias[c]
    out[c]   = clamp(rint(y[c] * float(1 / output_scale)) + output_zp, output_min, output_max)

each step one float32 operation (the kernels never contract them into an FMA). `output_min` /
`output_max` narrow the dtype's range: that is how a relu or hardtanh between the conv and its
quantize is applied (quantize is monotonic, so `quantize(clamp(y, lo, hi))` is
`clamp(quantize(y), quantize(lo), quantize(hi))` exactly; patterns/quantized_gemm_rules.py).

The accumulation is exact while every partial sum stays below 2**24 in magnitude (K products of
at most 255 * 255; the kernels sum in float32). Against the unfused float graph, which rounds
each product and sum to float32, an output can differ by one quantization step where y falls
within a few float32 ulps of a rounding boundary (measured in tests/test_quantized_gemm.py).
"""

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 (defines quantized_decomposed.quantize_per_tensor)

from .prepacked_ops import unpack_conv_weight, unpack_gemm_weight
from .registry import BackendOp, register

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _integers(q, zero_point):
    """float32(q) - zero_point: exact for 8-bit values and integer zero points."""
    return aten.sub.Tensor(aten._to_copy.default(q, dtype=torch.float32), zero_point)


def _channel_integers(weight, zero_point):
    """float32(w) - zero_point[c] along dim 0 (one zero point per output channel, None: 0)."""
    if zero_point is None:
        return aten._to_copy.default(weight, dtype=torch.float32)
    shape = [-1] + [1] * (weight.dim() - 1)
    zp = aten._to_copy.default(aten.view.default(zero_point, shape), dtype=torch.float32)
    return aten.sub.Tensor(aten._to_copy.default(weight, dtype=torch.float32), zp)


def _requantize(acc, input_scale, weight_scale, bias, channel_dim, output_scale, output_zero_point, output_min,
                output_max, dtype):
    shape = [1] * acc.dim()
    shape[channel_dim] = -1
    scale = aten.mul.Tensor(aten._to_copy.default(weight_scale, dtype=torch.float32), input_scale)
    y = aten.mul.Tensor(acc, aten.view.default(scale, shape))
    if bias is not None:
        y = aten.add.Tensor(y, aten.view.default(bias, shape))
    return qd.quantize_per_tensor.default(y, output_scale, output_zero_point, output_min, output_max, dtype)


def _quantized_conv2d(input, input_scale, input_zero_point, weight, weight_scale, weight_zero_point, bias, stride,
                      padding, dilation, groups, output_scale, output_zero_point, output_min, output_max):
    acc = aten.conv2d.default(_integers(input, input_zero_point), _channel_integers(weight, weight_zero_point), None,
                              stride, padding, dilation, groups)
    return _requantize(acc, input_scale, weight_scale, bias, 1, output_scale, output_zero_point, output_min,
                       output_max, input.dtype)


def _quantized_linear(input, input_scale, input_zero_point, weight, weight_scale, weight_zero_point, bias,
                      output_scale, output_zero_point, output_min, output_max):
    acc = aten.linear.default(_integers(input, input_zero_point), _channel_integers(weight, weight_zero_point))
    return _requantize(acc, input_scale, weight_scale, bias, -1, output_scale, output_zero_point, output_min,
                       output_max, input.dtype)


_INPUT = "Tensor input, float input_scale, int input_zero_point"
_WEIGHT = "Tensor weight, Tensor weight_scale, Tensor? weight_zero_point, Tensor? bias"
_OUTPUT = "float output_scale, int output_zero_point, int output_min, int output_max"

QUANTIZED_CONV2D = register(BackendOp(
    "etfuse",
    f"quantized_conv2d({_INPUT}, {_WEIGHT}, int[2] stride, int[2] padding, int[2] dilation, int groups, {_OUTPUT}) "
    "-> Tensor",
    _quantized_conv2d,
    doc="int8/uint8 NCHW input (per-tensor qparams), int8 weight (per-output-channel scale and zero point), float32 "
        "bias; integer accumulation, requantized to the input's dtype and clamped to [output_min, output_max]",
    kernel="quantized_conv2d"))
QUANTIZED_LINEAR = register(BackendOp(
    "etfuse",
    f"quantized_linear({_INPUT}, {_WEIGHT}, {_OUTPUT}) -> Tensor",
    _quantized_linear,
    doc="quantized_conv2d's arithmetic for input [..., in] @ weight[out, in].T",
    kernel="quantized_linear"))

QUANTIZED_GEMM_OPS = [QUANTIZED_CONV2D, QUANTIZED_LINEAR]


# ---- the weight packed once, at fuse time (PrepackWeightsPass) --------------------------------
# pack_gemm_weight's panels (backend_ops/prepacked_ops.py) of the int8 weight itself: the GEMM
# converts each K slice of a panel to floats as it packs it, so the weight stays 1 byte a value.
# Only for zero weight zero points (symmetric weights, the XNNPACK quantizer's), which the packed
# ops do not take.

def _quantized_conv2d_packed(input, input_scale, input_zero_point, packed_weight, weight_size, weight_scale, bias,
                             stride, padding, dilation, output_scale, output_zero_point, output_min, output_max):
    return _quantized_conv2d(input, input_scale, input_zero_point, unpack_conv_weight(packed_weight, weight_size),
                             weight_scale, None, bias, stride, padding, dilation, 1, output_scale, output_zero_point,
                             output_min, output_max)


def _quantized_linear_packed(input, input_scale, input_zero_point, packed_weight, out_features, weight_scale, bias,
                             output_scale, output_zero_point, output_min, output_max):
    return _quantized_linear(input, input_scale, input_zero_point, unpack_gemm_weight(packed_weight, out_features),
                             weight_scale, None, bias, output_scale, output_zero_point, output_min, output_max)


QUANTIZED_CONV2D_PACKED = register(BackendOp(
    "etfuse",
    f"quantized_conv2d_packed({_INPUT}, Tensor packed_weight, int[4] weight_size, Tensor weight_scale, Tensor? bias, "
    f"int[2] stride, int[2] padding, int[2] dilation, {_OUTPUT}) -> Tensor",
    _quantized_conv2d_packed,
    doc="quantized_conv2d (groups 1, weight zero points 0) on pack_gemm_weight(weight.reshape(Cout, -1)), int8 "
        "panels; weight_size = weight.shape",
    kernel="quantized_conv2d_packed"))
QUANTIZED_LINEAR_PACKED = register(BackendOp(
    "etfuse",
    f"quantized_linear_packed({_INPUT}, Tensor packed_weight, int out_features, Tensor weight_scale, Tensor? bias, "
    f"{_OUTPUT}) -> Tensor",
    _quantized_linear_packed,
    doc="quantized_linear (weight zero points 0) on pack_gemm_weight(weight), int8 panels",
    kernel="quantized_linear_packed"))

QUANTIZED_GEMM_OPS += [QUANTIZED_CONV2D_PACKED, QUANTIZED_LINEAR_PACKED]
