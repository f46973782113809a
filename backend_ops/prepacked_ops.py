"""Linear and conv2d on a weight packed once, at fuse time, into the GEMM's column panels.

`etfuse::linear_act` packs its weight ([out, in], read as the GEMM's transposed B) into panels of
16 columns on every call: at 37 rows (ViT-B/16 at 96x96) that copy costs about as much as the
multiply-adds. `etfuse.passes.PrepackWeightsPass` packs constant weights once instead:

    linear_act(x, w, b, min, max, act, residual)
        -> linear_packed_act(x, pack_gemm_weight(w), w.shape[0], b, min, max, act, residual)

(conv2d_act / conv2d_bn_act the same way, residual included) and folds `pack_gemm_weight` into a program constant, so the runtime only ever sees
`linear_packed_act`. The packed layout (`kernels/csrc/core/gemm.h`, `gemm::Args::packed_b`):

    packed[p, k, c] = w[p * 16 + c, k]   (0 for p * 16 + c >= out_features)

float32 [ceil(out / 16), in, 16], contiguous: the .pte grows by the zero columns only (none when
out_features is a multiple of 16). A conv2d weight [Cout, C, KH, KW] is packed as the matrix
[Cout, C * KH * KW]: `conv2d_packed_act` / `conv2d_bn_packed_act` (groups 1) run the transposed
problem, output pixels x output channels, on the GEMM's tiles (kernels/csrc/core/conv2d.h,
run_packed). Every op's pattern is ATen, so a fused program retraces to a plain `linear` /
`conv2d` on the unpacked weight.
"""

import torch

from .gemm_conv_ops import _conv2d_act, _conv2d_bn_act, linear_epilogue, with_residual
from .registry import BackendOp, register

aten = torch.ops.aten

PANEL = 16  # columns per panel: gemm::kPanel


def _pack_gemm_weight(weight):
    n = weight.shape[0]
    flat = aten.reshape.default(weight, [n, -1])  # a conv weight [Cout, C, KH, KW] as [Cout, K]
    k = flat.shape[1]
    panels = (n + PANEL - 1) // PANEL
    padded = aten.constant_pad_nd.default(flat, [0, 0, 0, panels * PANEL - n])
    by_panel = aten.permute.default(aten.reshape.default(padded, [panels, PANEL, k]), [0, 2, 1])
    return aten.clone.default(by_panel, memory_format=torch.contiguous_format)


def unpack_gemm_weight(packed, out_features: int):
    """pack_gemm_weight's layout -> the [out_features, in_features] weight."""
    panels, k, width = packed.shape
    rows = aten.reshape.default(aten.permute.default(packed, [0, 2, 1]), [panels * width, k])
    return aten.slice.Tensor(rows, 0, 0, out_features)


def _linear_packed_act(input, packed_weight, out_features, bias=None, min=None, max=None, activation="none",
                       residual=None):
    weight = unpack_gemm_weight(packed_weight, out_features)
    return linear_epilogue(with_residual(aten.linear.default(input, weight, bias), residual), min, max, activation)


def unpack_conv_weight(packed, weight_size):
    """A conv weight of `weight_size` [Cout, C, KH, KW] from pack_gemm_weight(weight.reshape(Cout, -1))."""
    return aten.reshape.default(unpack_gemm_weight(packed, weight_size[0]), list(weight_size))


def _conv2d_packed_act(input, packed_weight, weight_size, bias, stride, padding, dilation, min=None, max=None,
                       activation="none", residual=None):
    weight = unpack_conv_weight(packed_weight, weight_size)
    return _conv2d_act(input, weight, bias, stride, padding, dilation, 1, min, max, activation, residual)


def _conv2d_bn_packed_act(input, packed_weight, weight_size, bias, bn_weight, bn_bias, running_mean, running_var, eps,
                          stride, padding, dilation, min=None, max=None, activation="none", residual=None):
    weight = unpack_conv_weight(packed_weight, weight_size)
    return _conv2d_bn_act(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding,
                          dilation, 1, min, max, activation, residual)


PACK_GEMM_WEIGHT = register(BackendOp(
    "etfuse", "pack_gemm_weight(Tensor weight) -> Tensor", _pack_gemm_weight,
    doc="float32 [out, in] (or [out, ...], flattened to [out, in]) -> [ceil(out / 16), in, 16] column panels for "
        "the *_packed_act ops (zero past out); folded into a constant at fuse time, never run on the runtime"))
LINEAR_PACKED_ACT = register(BackendOp(
    "etfuse",
    "linear_packed_act(Tensor input, Tensor packed_weight, int out_features, Tensor? bias=None, float? min=None, "
    "float? max=None, str activation=\"none\", Tensor? residual=None) -> Tensor",
    _linear_packed_act,
    doc="linear_act on pack_gemm_weight(weight): activation(clamp(input @ weight.T + bias + residual, min, max)), "
        "gated activations included",
    kernel="linear_packed_act"))

CONV2D_PACKED_ACT = register(BackendOp(
    "etfuse",
    "conv2d_packed_act(Tensor input, Tensor packed_weight, int[4] weight_size, Tensor? bias, int[2] stride, "
    "int[2] padding, int[2] dilation, float? min=None, float? max=None, str activation=\"none\", "
    "Tensor? residual=None) -> Tensor",
    _conv2d_packed_act,
    doc="conv2d_act (groups 1) on pack_gemm_weight(weight.reshape(Cout, -1)), weight_size = weight.shape",
    kernel="conv2d_packed_act"))
_BN_ARGS = "Tensor? bn_weight, Tensor? bn_bias, Tensor running_mean, Tensor running_var, float eps"
CONV2D_BN_PACKED_ACT = register(BackendOp(
    "etfuse",
    f"conv2d_bn_packed_act(Tensor input, Tensor packed_weight, int[4] weight_size, Tensor? bias, {_BN_ARGS}, "
    "int[2] stride, int[2] padding, int[2] dilation, float? min=None, float? max=None, str activation=\"none\", "
    "Tensor? residual=None) -> Tensor",
    _conv2d_bn_packed_act,
    doc="conv2d_bn_act (groups 1) on pack_gemm_weight(weight.reshape(Cout, -1)), weight_size = weight.shape",
    kernel="conv2d_bn_packed_act"))

PREPACKED_OPS = [PACK_GEMM_WEIGHT, LINEAR_PACKED_ACT, CONV2D_PACKED_ACT, CONV2D_BN_PACKED_ACT]
