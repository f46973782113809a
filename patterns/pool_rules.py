"""Pooling: the stock runtime's max_pool2d_with_indices, avg_pool2d and mean over H, W on fast
kernels (one op each: nothing to fuse, a kernel to replace).

| rule                          | edge pattern                                                        | backend op         |
|-------------------------------|---------------------------------------------------------------------|--------------------|
| max_pool2d[_ceil][_stride_default] | max_pool2d_with_indices(x, k, s or [], p, d, ceil)[0], indices unused | etfuse::max_pool2d |
| avg_pool2d[_ceil][_no_pad_count][_stride_default] | avg_pool2d(x, k, s or [], p, ceil, count_include_pad) | etfuse::avg_pool2d |
| mean_hw[_keepdim]_<dims>      | mean.dim(x, dims, keepdim), dims H and W: [-2, -1], [-1, -2], [2, 3], [3, 2] | etfuse::mean_hw |

The edge dialect leaves trailing default arguments out and an omitted stride is `[]` (the
kernel size): the engine compares arguments through the schema, so defaults match, and the
`_stride_default` rules catch `[]`. Boolean arguments are literals of the patterns (one rule per
value): a rule's scalar parameters are found by example value, and two booleans cannot have
distinct ones. A `max_pool2d_with_indices` whose indices are read keeps the stock op (the
indices would be an interior value used outside the match). A `divisor_override` stays stock.
"""

from __future__ import annotations

import torch

from etfuse.backend_ops.pool_ops import AVG_POOL2D, MAX_POOL2D, MEAN_HW

from .constraints import all_of, int_scalars, output_dtype, tensors
from .rule import Match, Rule

aten = torch.ops.aten
F32 = (torch.float32,)

# Example scalars, pairwise distinct (scalars are found by example value) and valid for pooling
# (padding at most half the kernel).
_MAX_SCALARS = dict(k0=7, k1=8, s0=2, s1=3, p0=1, p1=4, d0=5, d1=6)
_AVG_SCALARS = dict(k0=5, k1=6, s0=3, s1=4, p0=1, p1=2)


def _rank_3_or_4(m: Match):
    rank = m.value("input").dim()
    return None if rank in (3, 4) else f"input has rank {rank}; the pooling kernels take (C, H, W) or (N, C, H, W)"


def _max_rule(ceil_mode: bool, stride_given: bool) -> Rule:
    if stride_given:
        def pattern(input, k0, k1, s0, s1, p0, p1, d0, d1):
            return aten.max_pool2d_with_indices.default(input, [k0, k1], [s0, s1], [p0, p1], [d0, d1], ceil_mode)[0]
    else:
        def pattern(input, k0, k1, p0, p1, d0, d1):
            return aten.max_pool2d_with_indices.default(input, [k0, k1], [], [p0, p1], [d0, d1], ceil_mode)[0]
    names = [n for n in _MAX_SCALARS if stride_given or not n.startswith("s")]

    def arguments(m: Match):
        b = m.bindings
        kernel = [b["k0"], b["k1"]]
        stride = [b["s0"], b["s1"]] if stride_given else kernel
        return (b["input"], kernel, stride, [b["p0"], b["p1"]], [b["d0"], b["d1"]], ceil_mode), {}

    name = "max_pool2d" + ("_ceil" if ceil_mode else "") + ("" if stride_given else "_stride_default")
    return Rule(name, pattern, MAX_POOL2D,
                lambda: (torch.randn(1, 2, 48, 48), *(_MAX_SCALARS[n] for n in names)),
                all_of(tensors(["input"], F32), _rank_3_or_4, int_scalars(names, "symbolic pooling parameters are "
                                                                        "not fused"), output_dtype(torch.float32)),
                arguments)


def _avg_rule(ceil_mode: bool, count_include_pad: bool, stride_given: bool) -> Rule:
    if stride_given:
        def pattern(input, k0, k1, s0, s1, p0, p1):
            return aten.avg_pool2d.default(input, [k0, k1], [s0, s1], [p0, p1], ceil_mode, count_include_pad)
    else:
        def pattern(input, k0, k1, p0, p1):
            return aten.avg_pool2d.default(input, [k0, k1], [], [p0, p1], ceil_mode, count_include_pad)
    names = [n for n in _AVG_SCALARS if stride_given or not n.startswith("s")]

    def arguments(m: Match):
        b = m.bindings
        kernel = [b["k0"], b["k1"]]
        stride = [b["s0"], b["s1"]] if stride_given else kernel
        return (b["input"], kernel, stride, [b["p0"], b["p1"]], ceil_mode, count_include_pad), {}

    name = ("avg_pool2d" + ("_ceil" if ceil_mode else "") + ("" if count_include_pad else "_no_pad_count")
            + ("" if stride_given else "_stride_default"))
    return Rule(name, pattern, AVG_POOL2D,
                lambda: (torch.randn(1, 2, 20, 20), *(_AVG_SCALARS[n] for n in names)),
                all_of(tensors(["input"], F32), _rank_3_or_4, int_scalars(names, "symbolic pooling parameters are "
                                                                        "not fused"), output_dtype(torch.float32)),
                arguments)


def _mean_rule(dims: tuple[int, int], keepdim: bool) -> Rule:
    def pattern(input):
        return aten.mean.dim(input, list(dims), keepdim)

    def last_two(m: Match):
        rank = m.value("input").dim()
        if min(dims) >= 0 and rank != 4:
            return f"dims {list(dims)} of a rank-{rank} input are not its last two"
        return None

    spelled = "_".join(str(d).replace("-", "m") for d in dims)
    return Rule(f"mean_hw{'_keepdim' if keepdim else ''}_{spelled}", pattern, MEAN_HW,
                lambda: (torch.randn(1, 4, 6, 6),),
                all_of(tensors(["input"], F32), last_two, output_dtype(torch.float32)),
                lambda m: ((m.bindings["input"], keepdim), {}))


POOL_RULES = [
    *(_max_rule(ceil, given) for ceil in (False, True) for given in (True, False)),
    *(_avg_rule(ceil, cip, given) for ceil in (False, True) for cip in (True, False) for given in (True, False)),
    *(_mean_rule(dims, keepdim) for dims in ((-2, -1), (-1, -2), (2, 3), (3, 2)) for keepdim in (True, False)),
]
