"""Pooling backend ops: fast kernels for what the stock runtime pools slowly.

| backend op          | pattern                                                                  |
|---------------------|--------------------------------------------------------------------------|
| etfuse::max_pool2d  | max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)[0] |
| etfuse::avg_pool2d  | avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override) |
| etfuse::mean_hw     | mean(input, [-2, -1], keepdim)  (global average pooling)                 |

`max_pool2d` computes no indices: it stands for the values of the stock op only, so a graph
that reads the indices keeps the stock op. `stride` is always given (the rules put the kernel
size where the model left it empty).
"""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode):
    return aten.max_pool2d_with_indices.default(input, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    return aten.avg_pool2d.default(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                   divisor_override)


def _mean_hw(input, keepdim):
    return aten.mean.dim(input, [-2, -1], keepdim)


MAX_POOL2D = register(BackendOp(
    "etfuse",
    "max_pool2d(Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode)"
    " -> Tensor",
    _max_pool2d,
    doc="max_pool2d values (no indices), (N, C, H, W) or (C, H, W) float32; NaN propagates", kernel="pool2d"))
AVG_POOL2D = register(BackendOp(
    "etfuse",
    "avg_pool2d(Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, bool ceil_mode, "
    "bool count_include_pad, int? divisor_override=None) -> Tensor",
    _avg_pool2d,
    doc="avg_pool2d, (N, C, H, W) or (C, H, W) float32, torch's divisor rules", kernel="pool2d"))
MEAN_HW = register(BackendOp(
    "etfuse",
    "mean_hw(Tensor input, bool keepdim) -> Tensor",
    _mean_hw,
    doc="mean over the last two dims (global average pooling), float32", kernel="pool2d"))

POOL_OPS = [MAX_POOL2D, AVG_POOL2D, MEAN_HW]
