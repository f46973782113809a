"""Pooling: etfuse::max_pool2d / avg_pool2d / mean_hw (backend_ops/pool_ops.py,
kernels/csrc/ops/pool2d.cpp, patterns/pool_rules.py). Kernels against torch's pooling (every
argument form, NaN, strided inputs, both ISAs; in eager and on the runtime), opcheck, the rules on
edge graphs (the exact fused ops, indices read keeps the stock op), the ExecuTorch runtime against
eager, retrace."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import assert_expected_inline

import etfuse.backend_ops.pool_ops  # noqa: F401  (schemas before the kernels load)
from etfuse.backend_ops import AVG_POOL2D, MAX_POOL2D, MEAN_HW
from etfuse.passes import FusionPass, fuse
from fusion_helpers import edge_program, op_names

ops = torch.ops.etfuse

pytestmark = pytest.mark.usefixtures("eager_kernels")


# shape, kernel, stride, padding, dilation, ceil_mode
MAX_CASES = [
    ((1, 3, 17, 17), (3, 3), (2, 2), (0, 0), (1, 1), False),   # SqueezeNet / ShuffleNet
    ((2, 4, 16, 16), (2, 2), (2, 2), (0, 0), (1, 1), False),
    ((1, 5, 15, 14), (3, 3), (2, 2), (1, 1), (1, 1), True),    # ResNet stem, ceil
    ((1, 2, 13, 11), (3, 2), (1, 3), (1, 1), (2, 3), True),    # dilated, asymmetric
    ((3, 9, 10), (5, 4), (3, 2), (2, 2), (1, 1), True),        # 3-D input
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1), False),
    ((1, 2, 7, 9), (7, 9), (1, 1), (0, 0), (1, 1), False),     # the whole plane
    ((1, 8, 48, 40), (2, 3), (1, 1), (1, 1), (1, 1), False),   # stride 1
    ((1, 4, 47, 47), (3, 3), (2, 2), (0, 0), (1, 1), True),    # SqueezeNet's at 96x96: 23 outputs a row (16 + 7)
    ((2, 3, 35, 70), (2, 2), (2, 2), (0, 0), (1, 1), False),   # 35 outputs a row, 3 vectors
]
# shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
AVG_CASES = [
    ((1, 3, 17, 17), (3, 3), (2, 2), (1, 1), False, True, None),
    ((2, 4, 16, 16), (2, 2), (2, 2), (0, 0), False, True, None),
    ((1, 5, 15, 14), (3, 3), (2, 2), (1, 1), True, False, None),
    ((1, 2, 13, 11), (3, 2), (1, 3), (1, 1), True, True, None),
    ((3, 9, 10), (5, 4), (3, 2), (2, 2), True, False, None),
    ((1, 2, 7, 9), (7, 9), (1, 1), (0, 0), False, True, None),
    ((1, 2, 8, 8), (3, 3), (2, 2), (1, 1), False, True, 5),
    # windows as wide as the map (pool2d.h avg_whole_rows): DS-CNN's 24x5 over 25x5, overlapping
    # rows with a ceil-mode window past the end, a divisor override
    ((1, 64, 25, 5), (24, 5), (24, 5), (0, 0), False, True, None),
    ((2, 3, 8, 4), (3, 4), (2, 1), (0, 0), True, True, None),
    ((1, 3, 9, 6), (4, 6), (3, 3), (0, 0), True, False, 7),
]


def _x(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _max_out(x, k, s, p, d, ceil):
    out = torch.empty(0)
    return ops.max_pool2d.out(x, list(k), list(s), list(p), list(d), ceil, out=out)


def _avg_out(x, k, s, p, ceil, cip, div):
    out = torch.empty(0)
    return ops.avg_pool2d.out(x, list(k), list(s), list(p), ceil, cip, div, out=out)


@pytest.mark.parametrize("case", MAX_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"_k{c[1][0]}{c[1][1]}")
def test_max_pool2d_kernel_is_exact(case):
    shape, k, s, p, d, ceil = case
    x = _x(shape, sum(shape))
    want = F.max_pool2d(x, k, s, p, d, ceil)
    torch.testing.assert_close(_max_out(x, k, s, p, d, ceil), want, rtol=0, atol=0)
    if x.dim() == 4:  # a strided (channels-last) input is read as it is
        torch.testing.assert_close(_max_out(x.to(memory_format=torch.channels_last), k, s, p, d, ceil), want,
                                   rtol=0, atol=0)


def test_max_pool2d_propagates_nan_and_infinities_like_torch():
    for shape in ((1, 2, 9, 9), (1, 2, 40, 41)):  # the second: NaNs in the second vector of a row
        x = _x(shape, 0)
        x[0, 0, 2, 3] = float("nan")
        x[0, 0, 7, shape[3] - 8] = float("nan")  # the first row of its windows (a NaN already in the sums)
        x[0, 0, 1, shape[3] // 2] = float("nan")
        x[0, 1, 4, 4] = float("-inf")
        x[0, 1, 0, 0] = float("inf")
        for ceil in (False, True):
            for stride in (1, 2):
                want = F.max_pool2d(x, 3, stride, 1, ceil_mode=ceil)
                got = _max_out(x, (3, 3), (stride, stride), (1, 1), (1, 1), ceil)
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("case", AVG_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"_k{c[1][0]}{c[1][1]}")
def test_avg_pool2d_kernel_matches_torch(case):
    shape, k, s, p, ceil, cip, div = case
    x = _x(shape, sum(shape))
    want = F.avg_pool2d(x, k, s, p, ceil, cip, div)
    torch.testing.assert_close(_avg_out(x, k, s, p, ceil, cip, div), want)


MEAN_SHAPES = [(1, 1280, 7, 7), (2, 3, 1, 1), (4, 5, 33, 17), (6, 9)]


@pytest.mark.parametrize("shape", MEAN_SHAPES)
def test_mean_hw_kernel_matches_torch(shape):
    x = _x(shape, 1)
    for keepdim in (True, False):
        out = torch.empty(0)
        torch.testing.assert_close(ops.mean_hw.out(x, keepdim, out=out), x.mean((-2, -1), keepdim=keepdim))


def test_runtime_kernels_match_torch(kernel_check):
    """Every case above in one program per op on the ExecuTorch runtime (the 4-D inputs also
    channels-last: the dim order a program takes)."""
    for op, cases in ((MAX_POOL2D, [(_x(c[0], sum(c[0])), *map(list, c[1:5]), c[5]) for c in MAX_CASES]),
                      (AVG_POOL2D, [(_x(c[0], sum(c[0])), *map(list, c[1:4]), *c[4:]) for c in AVG_CASES]),
                      (MEAN_HW, [(_x(shape, 1), keepdim) for shape in MEAN_SHAPES for keepdim in (True, False)])):
        with_cl = [*cases, *(cl for cl in map(kernel_check.channels_last_case, cases) if cl is not None)]
        kernel_check.runtime(op, with_cl, tol=dict(rtol=0, atol=0) if op is MAX_POOL2D else None)


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2"], indirect=True)
def test_narrower_isas_compute_the_same(kernel_isa):
    for shape, k, s, p, d, ceil in MAX_CASES[:4]:
        x = _x(shape, 3)
        torch.testing.assert_close(_max_out(x, k, s, p, d, ceil), F.max_pool2d(x, k, s, p, d, ceil), rtol=0, atol=0)
    for shape, k, s, p, ceil, cip, div in AVG_CASES[:4]:
        x = _x(shape, 4)
        torch.testing.assert_close(_avg_out(x, k, s, p, ceil, cip, div), F.avg_pool2d(x, k, s, p, ceil, cip, div))


def test_opcheck(opcheck):
    x = _x((2, 3, 9, 8), 5)
    for op, args in ((MAX_POOL2D, (x, [3, 3], [2, 2], [1, 1], [1, 1], True)),
                     (AVG_POOL2D, (x, [3, 2], [2, 1], [1, 0], False, False, None)),
                     (MEAN_HW, (x, True))):
        opcheck(op.aten, args)
        opcheck.out(op.aten_out, args, op.aten(*args))


def test_bad_arguments_are_errors_that_name_the_op():
    x = _x((1, 2, 5, 5), 6)
    with pytest.raises(RuntimeError, match=r"etfuse::max_pool2d.out: padding should be at most half"):
        _max_out(x, (2, 2), (2, 2), (2, 2), (1, 1), False)
    with pytest.raises(RuntimeError, match=r"etfuse::max_pool2d.out: input \[1, 2, 5, 5\] is too small"):
        _max_out(x, (7, 7), (1, 1), (0, 0), (1, 1), False)
    with pytest.raises(RuntimeError, match=r"etfuse::avg_pool2d.out: input must be 3-D \(C, H, W\) or 4-D"):
        _avg_out(x[0, 0], (2, 2), (2, 2), (0, 0), False, True, None)
    with pytest.raises(RuntimeError, match=r"etfuse::avg_pool2d.out: divisor_override must be non-zero"):
        _avg_out(x, (2, 2), (2, 2), (0, 0), False, True, 0)
    with pytest.raises(RuntimeError, match=r"etfuse::mean_hw.out: input must be float32, got Long"):
        ops.mean_hw.out(torch.ones(2, 2, dtype=torch.long), True, out=torch.empty(0))


# --------------------------------------------------------------------------------------------
# rules, runtime, retrace


class Pools(nn.Module):
    """Every spelling the edge dialect gives pooling in models: nn.MaxPool2d, F.max_pool2d with
    the stride left out, ceil mode, avg_pool2d with and without padding counted, global average
    pooling as mean and as adaptive_avg_pool2d(1)."""

    def forward(self, x):
        return (F.max_pool2d(x, 3, 2), F.max_pool2d(x, 2), nn.MaxPool2d(3, 2, 1, ceil_mode=True)(x),
                F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
                x.mean((2, 3), keepdim=True), F.adaptive_avg_pool2d(x, 1), x.mean((-1, -2)))


def test_every_spelling_is_fused(fused_matches_eager):
    x = _x((2, 4, 17, 16), 7)
    x[1, 2, 5, 5] = float("nan")
    edge = edge_program(Pools(), (x,))
    passes = [FusionPass()]
    out = fuse(edge, passes)
    assert_expected_inline("\n".join(str(n.format_node()) for n in out.exported_program().graph.nodes
                                     if n.op == "call_function").replace(
                                         "executorch.exir.dialects.backend._ops.", ""), """\
%etfuse_max_pool2d_default : [num_users=1] = call_function[target=etfuse.max_pool2d.default](args = (%x, [3, 3], [2, 2], [0, 0], [1, 1], False), kwargs = {})
%etfuse_max_pool2d_default_1 : [num_users=1] = call_function[target=etfuse.max_pool2d.default](args = (%x, [2, 2], [2, 2], [0, 0], [1, 1], False), kwargs = {})
%etfuse_max_pool2d_default_2 : [num_users=1] = call_function[target=etfuse.max_pool2d.default](args = (%x, [3, 3], [2, 2], [1, 1], [1, 1], True), kwargs = {})
%etfuse_avg_pool2d_default : [num_users=1] = call_function[target=etfuse.avg_pool2d.default](args = (%x, [3, 3], [2, 2], [1, 1], False, True), kwargs = {})
%etfuse_avg_pool2d_default_1 : [num_users=1] = call_function[target=etfuse.avg_pool2d.default](args = (%x, [2, 2], [2, 2], [0, 0], True, False), kwargs = {})
%etfuse_mean_hw_default : [num_users=1] = call_function[target=etfuse.mean_hw.default](args = (%x, True), kwargs = {})
%etfuse_mean_hw_default_1 : [num_users=1] = call_function[target=etfuse.mean_hw.default](args = (%x, True), kwargs = {})
%etfuse_mean_hw_default_2 : [num_users=1] = call_function[target=etfuse.mean_hw.default](args = (%x, False), kwargs = {})""")
    assert sorted({f.rule for f in passes[0].report.fused}) == [
        "avg_pool2d", "avg_pool2d_ceil_no_pad_count_stride_default", "max_pool2d", "max_pool2d_ceil",
        "max_pool2d_stride_default", "mean_hw_keepdim_2_3", "mean_hw_keepdim_m1_m2", "mean_hw_m1_m2"]
    fused_matches_eager(Pools(), (x,), out)  # NaN where eager has it


def test_indices_read_keeps_the_stock_op():
    class WithIndices(nn.Module):
        def forward(self, x):
            values, indices = F.max_pool2d(x, 2, return_indices=True)
            return values * 2, indices

    x = _x((1, 2, 8, 8), 8)
    out = fuse(edge_program(WithIndices(), (x,)), [FusionPass()])
    assert "aten.max_pool2d_with_indices.default" in op_names(out.exported_program().graph_module)
    assert "etfuse.max_pool2d.default" not in op_names(out.exported_program().graph_module)


def test_dims_that_are_not_height_and_width_stay():
    class Means(nn.Module):
        def forward(self, x, y):
            return x.mean((1, 2), keepdim=True), y.mean((2, 3))  # y is 5-D: 2, 3 are not its last two

    x, y = _x((2, 3, 4, 5), 9), _x((2, 3, 4, 5, 6), 10)
    out = fuse(edge_program(Means(), (x, y)), [FusionPass()])
    assert op_names(out.exported_program().graph_module) == ["aten.mean.dim", "aten.mean.dim"]
