"""GEMM / conv2d fusions (backend_ops/gemm_conv_ops.py, kernels/csrc/ops/conv2d_act.cpp,
conv2d_bn_act.cpp, linear_act.cpp, linear_bn_act.cpp, patterns/gemm_conv_rules.py): batch norm
folding, conv2d_act / linear_act graphs, kernels vs eager, the ExecuTorch runtime, retrace, and
composition with the XNNPACK partitioner."""


import pytest
import torch
import torch.nn.functional as F
from expecttest import assert_expected_inline

import etfuse.backend_ops.gemm_conv_ops  # noqa: F401  (schemas before the kernels load)
from etfuse.backend_ops import CONV2D_ACT, CONV2D_BN_ACT, LINEAR_ACT
from etfuse.passes import FloatFusionPass, FusionPass, GemmConvFusionPass, fuse
from etfuse.runtime import load_method, run
from fusion_helpers import edge_program, op_names

ops = torch.ops.etfuse
TOL = dict(rtol=1e-4, atol=1e-4)


pytestmark = pytest.mark.usefixtures("eager_kernels")


def _randomise_bn(model):
    """Non-trivial running statistics, so folding is visible in the numbers."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g))
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.randn(m.num_features, generator=g))
                m.bias.data.copy_(torch.randn(m.num_features, generator=g))
    return model.eval()


def gemm_conv_passes():
    """The one rule table (batch norm included: conv2d_bn_act / linear_bn_act)."""
    return [FusionPass()]


def fused(model, args, passes=None):
    edge = edge_program(model, args)
    passes = gemm_conv_passes() if passes is None else passes
    return edge, fuse(edge, passes), passes


# --------------------------------------------------------------------------------------------
# kernels (torch eager registrations of the shared cores)

CONV_CASES = [
    # N, C, H, W, Cout, KH, KW, stride, padding, dilation, groups
    (1, 3, 17, 17, 5, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (2, 16, 32, 32, 17, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (3, 6, 11, 7, 12, 3, 2, (2, 1), (1, 0), (1, 2), 3),
    (1, 17, 5, 5, 257, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    (2, 20, 25, 5, 24, 1, 1, (1, 1), (0, 0), (1, 1), 2),  # pointwise, grouped, 125 pixels (DS-CNN's map)
    # pointwise from few channels (gemm.h rows-outer order): two row blocks (24 + 13 rows) walked
    # in two column groups of 4 panels, the last group 3 panels and an empty task
    (1, 32, 10, 10, 37, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    # stems: a 3-channel stride-2 one (direct kernel), DS-CNN's 1-channel 10x4 input conv
    (2, 3, 20, 19, 8, 3, 3, (2, 2), (1, 1), (1, 1), 1),
    (1, 1, 49, 10, 16, 10, 4, (2, 2), (5, 1), (1, 1), 1),  # output rows 5 wide: the implicit GEMM
    # rows 6 wide (pack_windows' short rows) with K = 285 in two slices of 143: the second starts
    # inside a channel's taps
    (1, 95, 7, 6, 20, 1, 3, (1, 1), (0, 1), (1, 1), 1),
    # strided 1x1 convs (ResNet shortcuts): the sampled pixels gathered once into flat planes,
    # even floats 4 at a time at stride 2 (rows of odd width: the last ones one by one), grouped
    # at stride 3 x 2
    (1, 16, 32, 32, 32, 1, 1, (2, 2), (0, 0), (1, 1), 1),
    (2, 6, 11, 13, 8, 1, 1, (3, 2), (0, 0), (1, 1), 2),
    (2, 3, 96, 80, 8, 3, 3, (2, 2), (1, 1), (1, 1), 1),  # a stem whose input is split in parallel, 2 images
    (1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    (2, 8, 9, 13, 8, 3, 3, (2, 2), (1, 1), (1, 1), 8),    # depthwise, stride 2
    (1, 5, 7, 7, 10, 5, 5, (1, 1), (2, 2), (2, 2), 5),    # depthwise x2 multiplier, dilated
    (2, 6, 17, 3, 6, 3, 1, (1, 2), (1, 0), (2, 1), 6),
    (1, 32, 16, 16, 32, 3, 3, (1, 1), (1, 1), (1, 1), 32),
    # the GEMM over phase planes (conv2d.h run_phase_gemm): stride 3 x 2, dilated, non-square;
    # several panels over output rows of 14; K = 360 in two slices; a 5x5 map; grouped, 2 images
    (1, 12, 19, 23, 40, 3, 5, (3, 2), (2, 1), (2, 1), 1),
    (2, 20, 14, 14, 70, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (1, 40, 10, 10, 24, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (1, 33, 9, 9, 64, 3, 3, (2, 2), (1, 1), (1, 1), 1),
    (2, 16, 12, 12, 32, 3, 3, (1, 1), (2, 2), (2, 2), 4),
    # ... split across threads, each task splitting the input rows it reads: bands of output
    # rows (maps of many panels: 48 output channels in 6 row tiles, panels that end inside
    # output rows) or blocks of output channels (few panels: 2 images at stride 2, 37 channels
    # in 5 tiles of 8 and 7 rows; 13 channels on 5-wide rows, a panel spans 6 of them)
    (1, 32, 32, 32, 48, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (2, 24, 20, 30, 37, 3, 3, (2, 2), (1, 1), (1, 1), 1),
    (1, 64, 60, 5, 13, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    # bands over phase planes: stride 2 and dilation 2 (the padding rows in the first and last
    # bands); a 5x3 at stride 2 x 1 (each band reads 2 phase rows past its own)
    (1, 16, 64, 40, 32, 3, 3, (2, 2), (2, 2), (2, 2), 1),
    (1, 12, 70, 33, 20, 5, 3, (2, 1), (2, 0), (1, 1), 1),
    # SqueezeNet 1.1's stem (unpadded, stride 2): output rows 47 wide on a pitch of 48, so the
    # runs start at every offset of the 16-float vectors (tap_tile_masked's pieces)
    (1, 3, 96, 96, 64, 3, 3, (2, 2), (0, 0), (1, 1), 1),
    # depthwise on the small maps of a network's tail, odd strides, padding wider than the taps
    (1, 24, 3, 3, 24, 3, 3, (1, 1), (1, 1), (1, 1), 24),
    (2, 16, 6, 6, 16, 3, 3, (2, 2), (1, 1), (1, 1), 16),
    (1, 8, 4, 11, 8, 5, 5, (3, 2), (2, 2), (1, 1), 8),
    (1, 4, 1, 1, 4, 3, 3, (1, 1), (2, 2), (1, 1), 4),
    (1, 6, 7, 9, 12, 3, 3, (2, 3), (0, 2), (2, 1), 6),
    # small maps as dot products over the transposed im2col (conv2d.h small_map)
    (1, 160, 3, 3, 48, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    (2, 64, 7, 7, 42, 3, 3, (1, 1), (1, 1), (1, 1), 2),
    (1, 48, 6, 3, 7, 3, 3, (2, 1), (1, 2), (1, 2), 1),
    # depthwise on small output maps, channels at a time (conv2d.h depthwise_channels): a last
    # block of 5 channels, stride 2, dilation, a 5x5 without padding
    (2, 13, 5, 7, 13, 3, 3, (1, 1), (1, 1), (1, 1), 13),
    (1, 20, 6, 6, 20, 3, 3, (2, 2), (1, 1), (1, 1), 20),
    (1, 16, 7, 7, 16, 3, 3, (1, 1), (2, 2), (2, 2), 16),
    (1, 8, 9, 8, 8, 5, 5, (1, 1), (0, 0), (1, 1), 8),
    # depthwise on flattened planes (conv2d.h depthwise_flat): DS-CNN's 25x5 map, a 5x5, rows
    # padded apart from columns (fewer and more output rows), a 1x3, a map one column wide,
    # dilated columns, a map of whole blocks (with AVX-512, maps of up to 64 outputs run
    # depthwise_channels instead; test_narrower_isas_compute_the_same runs them flat)
    (1, 11, 25, 5, 11, 3, 3, (1, 1), (1, 1), (1, 1), 11),
    (2, 9, 6, 6, 9, 5, 5, (1, 1), (2, 2), (1, 1), 9),
    (1, 7, 8, 5, 7, 3, 3, (1, 1), (0, 1), (1, 1), 7),
    (1, 6, 5, 9, 6, 1, 3, (1, 1), (2, 1), (1, 1), 6),
    (1, 5, 10, 1, 5, 3, 3, (1, 1), (1, 1), (1, 1), 5),
    (1, 3, 4, 6, 3, 3, 3, (1, 1), (1, 2), (1, 2), 3),
    (1, 4, 8, 8, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),  # 64 outputs: every block written in place
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_g{c[-1]}")
def test_conv2d_act_kernel_matches_eager(case):
    n, c, h, w, cout, kh, kw, stride, padding, dilation, groups = case
    g = torch.Generator().manual_seed(sum(case[:7]))
    x = torch.randn(n, c, h, w, generator=g)
    weight = torch.randn(cout, c // groups, kh, kw, generator=g)
    bias = torch.randn(cout, generator=g)
    for b in (bias, None):
        for lo, hi in ((None, None), (0.0, None), (0.0, 6.0), (-0.5, 0.5)):
            want = F.conv2d(x, weight, b, stride, padding, dilation, groups)
            if lo is not None or hi is not None:
                want = want.clamp(lo, hi)
            for inp in (x, x.to(memory_format=torch.channels_last)):
                out = torch.empty(0)
                ops.conv2d_act.out(inp, weight, b, list(stride), list(padding), list(dilation), groups, lo, hi, out=out)
                torch.testing.assert_close(out, want, **TOL)
            # the pattern (what a retrace gives back) is conv2d then the clamp
            torch.testing.assert_close(
                CONV2D_ACT.pattern(x, weight, b, list(stride), list(padding), list(dilation), groups, lo, hi), want,
                **TOL)


def test_flat_depthwise_keeps_an_inf_in_its_own_row():
    """depthwise_flat reads across a row's edge into the next row and drops those lanes: an inf
    at the end of one row must not reach the start of the next (a multiply by 0 would make NaN)."""
    x = torch.randn(1, 4, 25, 5)
    x[0, 1, 3, 4] = float("inf")
    x[0, 2, 7, 0] = float("-inf")
    weight, bias = torch.randn(4, 1, 3, 3), torch.randn(4)
    out = torch.empty(0)
    ops.conv2d_act.out(x, weight, bias, [1, 1], [1, 1], [1, 1], 4, None, None, out=out)
    want = F.conv2d(x, weight, bias, 1, 1, 1, 4)
    assert want.isfinite().sum() > 0 and not want.isfinite().all()
    torch.testing.assert_close(out, want, equal_nan=True, **TOL)


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2"], indirect=True)
def test_narrower_isas_compute_the_same(kernel_isa):
    """The SSE2 / AVX2 copies of the GEMM tiles, dot-product rows and depthwise strips."""
    for case in (*(CONV_CASES[i] for i in (1, 2, 5, 7, 8, 9, 10, 11, 13, 14, 16, 22, 23, 24, 25, 26)),
                 *CONV_CASES[-10:]):
        n, c, h, w, cout, kh, kw, stride, padding, dilation, groups = case
        x, weight, bias = torch.randn(n, c, h, w), torch.randn(cout, c // groups, kh, kw), torch.randn(cout)
        out = torch.empty(0)
        ops.conv2d_act.out(x, weight, bias, list(stride), list(padding), list(dilation), groups, 0.0, None, out=out)
        torch.testing.assert_close(out, F.conv2d(x, weight, bias, stride, padding, dilation, groups).relu(), **TOL)
    for m in (1, 3, 70):
        x, weight = torch.randn(m, 37), torch.randn(19, 37)
        out = torch.empty(0)
        ops.linear_act.out(x, weight, None, -0.5, 0.5, out=out)
        torch.testing.assert_close(out, F.linear(x, weight).clamp(-0.5, 0.5), **TOL)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 17, 257), (64, 256, 256), (5, 1024, 3), (257, 3, 17)])
def test_linear_act_kernel_matches_eager(m, k, n):
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    for lo, hi in ((None, None), (0.0, 6.0), (-1.0, None), (None, 0.25)):
        for bias in (b, None):
            want = F.linear(x, w, bias)
            if lo is not None or hi is not None:
                want = want.clamp(lo, hi)
            out = torch.empty(0)
            ops.linear_act.out(x, w, bias, lo, hi, out=out)
            torch.testing.assert_close(out, want, **TOL)


def _bn_stats(c, g, affine=True):
    stats = dict(running_mean=torch.randn(c, generator=g), running_var=torch.rand(c, generator=g) + 0.5)
    stats["bn_weight"] = torch.randn(c, generator=g) if affine else None
    stats["bn_bias"] = torch.randn(c, generator=g) if affine else None
    return stats


def _eval_bn(y, s, eps):
    return F.batch_norm(y, s["running_mean"], s["running_var"], s["bn_weight"], s["bn_bias"], False, 0.0, eps)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_g{c[-1]}")
def test_conv2d_bn_act_kernel_matches_eager(case):
    """Batch norm as the conv kernel's per-channel epilogue (GEMM and depthwise paths)."""
    n, c, h, w, cout, kh, kw, stride, padding, dilation, groups = case
    g = torch.Generator().manual_seed(sum(case[:7]))
    x = torch.randn(n, c, h, w, generator=g)
    weight, bias = torch.randn(cout, c // groups, kh, kw, generator=g), torch.randn(cout, generator=g)
    for b, affine, (lo, hi) in ((bias, True, (0.0, None)), (None, True, (0.0, 6.0)), (None, False, (None, None))):
        s, eps = _bn_stats(cout, g, affine), 1e-3
        want = _eval_bn(F.conv2d(x, weight, b, stride, padding, dilation, groups), s, eps)
        if lo is not None or hi is not None:
            want = want.clamp(lo, hi)
        args = (weight, b, s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], eps, list(stride),
                list(padding), list(dilation), groups, lo, hi)
        out = torch.empty(0)
        ops.conv2d_bn_act.out(x, *args, out=out)
        torch.testing.assert_close(out, want, **TOL)
        torch.testing.assert_close(CONV2D_BN_ACT.pattern(x, *args), want, **TOL)  # the pattern is eager's


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 17, 257), (64, 256, 256), (257, 3, 17)])
def test_linear_bn_act_kernel_matches_eager(m, k, n):
    g = torch.Generator().manual_seed(m + k + n)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias, affine, (lo, hi) in ((b, True, (None, None)), (None, True, (0.0, None)), (b, False, (-0.5, 0.5))):
        s, eps = _bn_stats(n, g, affine), 1e-5
        want = _eval_bn(F.linear(x, w, bias), s, eps)
        if lo is not None or hi is not None:
            want = want.clamp(lo, hi)
        out = torch.empty(0)
        ops.linear_bn_act.out(x, w, bias, s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], eps, lo,
                              hi, out=out)
        torch.testing.assert_close(out, want, **TOL)


def test_bn_act_ops_pass_opcheck(opcheck):
    g = torch.Generator().manual_seed(0)
    s = _bn_stats(6, g)
    bn = (s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], 1e-5)
    conv = (torch.randn(2, 3, 7, 7), torch.randn(6, 3, 3, 3), torch.randn(6), *bn, [1, 1], [1, 1], [1, 1], 1, 0.0, 6.0)
    linear = (torch.randn(4, 5), torch.randn(6, 5), None, *bn, None, None)
    for op, args, shape in ((ops.conv2d_bn_act, conv, (2, 6, 7, 7)), (ops.linear_bn_act, linear, (4, 6))):
        opcheck(op.default, args)
        opcheck.out(op.out, args, torch.empty(shape))


def test_bn_act_bad_statistics_raise_not_abort():
    x, w = torch.randn(1, 4, 8, 8), torch.randn(6, 4, 3, 3)
    with pytest.raises(RuntimeError, match=r"etfuse::conv2d_bn_act.out: running_var must be \[N\]"):
        ops.conv2d_bn_act.out(x, w, None, None, None, torch.randn(6), torch.rand(5), 1e-5, [1, 1], [0, 0], [1, 1], 1,
                              None, None, out=torch.empty(0))


def test_bad_shapes_raise_not_abort():
    x, w = torch.randn(1, 4, 8, 8), torch.randn(6, 4, 3, 3)
    out = torch.empty(0)
    with pytest.raises(RuntimeError, match="groups"):
        ops.conv2d_act.out(x, torch.randn(6, 3, 3, 3), None, [1, 1], [0, 0], [1, 1], 1, None, None, out=out)
    with pytest.raises(RuntimeError, match="bias must have shape"):
        ops.conv2d_act.out(x, w, torch.randn(5), [1, 1], [0, 0], [1, 1], 1, None, None, out=out)
    with pytest.raises(RuntimeError, match="larger than the padded input"):
        ops.conv2d_act.out(torch.randn(1, 4, 2, 2), w, None, [1, 1], [0, 0], [1, 1], 1, None, None, out=out)
    with pytest.raises(RuntimeError, match="stride"):
        ops.conv2d_act.out(x, w, None, [0, 1], [0, 0], [1, 1], 1, None, None, out=out)
    with pytest.raises(RuntimeError, match="greater than max"):
        ops.linear_act.out(torch.randn(2, 3), torch.randn(4, 3), None, 1.0, 0.0, out=out)
    with pytest.raises(RuntimeError, match="float32"):
        ops.conv2d_act.out(x.double(), w.double(), None, [1, 1], [0, 0], [1, 1], 1, None, None, out=out.double())


# --------------------------------------------------------------------------------------------
# models


class ConvBnRelu(torch.nn.Module):
    def __init__(self, act="relu", bias=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.bn = torch.nn.BatchNorm2d(8)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        if self.act == "relu":
            return torch.relu(y)
        if self.act == "relu6":
            return F.relu6(y)
        if self.act == "clamp":
            return torch.clamp(y, min=-0.5)
        return y


class ResBlock(torch.nn.Module):
    """ResNet-style: conv-bn-relu, conv-bn, relu(add(., skip)), depthwise, pooled linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(16)
        self.dw = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        y = F.relu6(self.dw(y))
        return self.head(y.mean((2, 3)))


class Mlp(torch.nn.Module):
    """Autoencoder layer: linear -> batch norm -> relu, then a hardtanh and a plain linear."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(17, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.l2 = torch.nn.Linear(32, 32, bias=False)
        self.l3 = torch.nn.Linear(32, 17)

    def forward(self, x):
        y = torch.relu(self.bn(self.l1(x)))
        y = F.hardtanh(self.l2(y), -1.0, 2.0)
        return self.l3(y)


def test_conv_bn_relu_graph():
    model = _randomise_bn(ConvBnRelu())
    x = torch.randn(2, 3, 8, 8)
    edge, out, passes = fused(model, (x,))
    assert op_names(edge.exported_program().graph_module) == [
        "aten.convolution.default", "aten._native_batch_norm_legit_no_training.default", "getitem",
        "aten.relu.default"]
    ep = out.exported_program()
    assert_expected_inline(str(ep.graph).strip(), """\
graph():
    %p_conv_weight : [num_users=1] = placeholder[target=p_conv_weight]
    %p_bn_weight : [num_users=1] = placeholder[target=p_bn_weight]
    %p_bn_bias : [num_users=1] = placeholder[target=p_bn_bias]
    %b_bn_running_mean : [num_users=1] = placeholder[target=b_bn_running_mean]
    %b_bn_running_var : [num_users=1] = placeholder[target=b_bn_running_var]
    %b_bn_num_batches_tracked : [num_users=0] = placeholder[target=b_bn_num_batches_tracked]
    %x : [num_users=1] = placeholder[target=x]
    %etfuse_conv2d_bn_act_default : [num_users=1] = call_function[target=executorch.exir.dialects.backend._ops.etfuse.conv2d_bn_act.default](args = (%x, %p_conv_weight, None, %p_bn_weight, %p_bn_bias, %b_bn_running_mean, %b_bn_running_var, 1e-05, [1, 1], [1, 1], [1, 1], 1, 0.0, None), kwargs = {})
    return (etfuse_conv2d_bn_act_default,)""")
    # the batch norm is the kernel's epilogue: the program keeps the parameters as they are
    assert sorted(ep.constants) == []
    assert sorted(ep.state_dict) == sorted(model.state_dict())
    assert [(f.rule, f.replaced) for p in passes if hasattr(p, "report") for f in p.report.fused] == [
        ("conv2d_bn_relu", ["aten_convolution_default", "aten__native_batch_norm_legit_no_training_default",
                            "getitem", "aten_relu_default"])]
    # the caller's program is untouched
    assert "aten._native_batch_norm_legit_no_training.default" in op_names(edge.exported_program().graph_module)
    assert "conv.weight" in edge.exported_program().state_dict
    want = model(x)
    torch.testing.assert_close(ep.module()(x), want, **TOL)
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], want, **TOL)


def test_activations_become_clamp_ranges():
    x = torch.randn(1, 3, 8, 8)
    for act, rng in (("relu6", (0.0, 6.0)), ("clamp", (-0.5, None)), ("none", (None, None))):
        model = _randomise_bn(ConvBnRelu(act, bias=True))
        _, out, _ = fused(model, (x,))
        (node,) = [n for n in out.exported_program().graph.nodes if n.op == "call_function"]
        assert op_names(out.exported_program().graph_module) == ["etfuse.conv2d_bn_act.default"]
        assert tuple(node.args[-2:]) == rng, act
        torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_resnet_block_runtime_and_retrace():
    model = _randomise_bn(ResBlock())
    x = torch.randn(2, 3, 16, 16)
    _, out, passes = fused(model, (x,))
    gm = out.exported_program().graph_module
    # relu(b2(c2(y)) + y): the second conv adds the skip connection in its epilogue
    # (patterns/conv_residual_rules.py, tests/test_conv_residual.py)
    assert op_names(gm) == [
        "etfuse.conv2d_bn_act.default", "etfuse.conv2d_bn_act.default", "etfuse.conv2d_act.default",
        "etfuse.mean_hw.default", "etfuse.linear_act.default"]
    want = model(x)
    # retrace first: to_executorch rewrites the program's graph in place
    retraced = out.exported_program().run_decompositions()
    names = op_names(retraced.graph_module)
    assert not [n for n in names if n.startswith("etfuse.")], names
    assert "aten.convolution.default" in names
    torch.testing.assert_close(retraced.module()(x), want, **TOL)
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], want, **TOL)


def test_mlp_linear_bn_relu():
    model = _randomise_bn(Mlp())
    x = torch.randn(5, 17)
    _, out, _ = fused(model, (x,))
    assert op_names(out.exported_program().graph_module) == [
        "etfuse.linear_bn_act.default", "etfuse.linear_act.default", "etfuse.linear_act.default"]
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_pass_order_does_not_matter_for_linear_relu():
    model = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.ReLU())
    x = torch.randn(3, 8)
    for passes in ([GemmConvFusionPass(), FloatFusionPass()], [FloatFusionPass(), GemmConvFusionPass()]):
        _, out, _ = fused(model, (x,), passes)
        assert op_names(out.exported_program().graph_module) == ["etfuse.linear_relu.default"]


def test_bn_with_input_statistics_is_fused_too():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x, mean, var):
            return torch.relu(F.batch_norm(self.conv(x), mean, var, training=False))

    args = (torch.randn(1, 3, 6, 6), torch.randn(4), torch.rand(4) + 1)
    model = M()
    p = GemmConvFusionPass()
    _, out, _ = fused(model, args, [p])
    # the statistics are inputs, not constants: the kernel reads them per call all the same
    assert [f.rule for f in p.report.fused] == ["conv2d_bn_relu"]
    assert op_names(out.exported_program().graph_module) == ["etfuse.conv2d_bn_act.default"]
    torch.testing.assert_close(run(out.to_executorch(), args)[0], model(*args), **TOL)


def test_conv_output_with_other_users_keeps_its_batch_norm():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    model, x = _randomise_bn(M()), torch.randn(1, 3, 6, 6)
    _, out, _ = fused(model, (x,))
    # the conv's output is read twice: it is fused alone, the batch norm stays
    assert op_names(out.exported_program().graph_module) == [
        "etfuse.conv2d_act.default", "aten._native_batch_norm_legit_no_training.default", "getitem",
        "aten.add.Tensor"]
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_dtype_the_kernel_lacks_is_declined():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).double()
    p = GemmConvFusionPass()
    _, out, _ = fused(model, (torch.randn(1, 3, 6, 6, dtype=torch.float64),), [p])
    assert op_names(out.exported_program().graph_module) == ["aten.convolution.default", "aten.relu.default"]
    assert {d.rule for d in p.report.declined} == {"conv2d_relu", "conv2d"}
    assert "torch.float64" in p.report.declined[0].reason


def test_transposed_conv_stays():
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(3, 4, 3), torch.nn.ReLU())
    _, out, _ = fused(model, (torch.randn(1, 3, 5, 5),))
    assert "etfuse.conv2d_act.default" not in op_names(out.exported_program().graph_module)


class Conv1dNet(torch.nn.Module):
    """conv1d + batch norm + relu, depthwise + relu6, a plain 1x1 (no bias): every conv1d rule kind."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(4, 8, 5, stride=2, padding=3, dilation=2)
        self.bn = torch.nn.BatchNorm1d(8)
        self.c2 = torch.nn.Conv1d(8, 8, 3, groups=8, bias=False)
        self.c3 = torch.nn.Conv1d(8, 6, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        return self.c3(F.hardtanh(self.c2(y), 0.0, 6.0))


def test_conv1d_runs_on_the_conv2d_kernels():
    model = _randomise_bn(Conv1dNet())
    args = (torch.randn(2, 4, 64),)
    edge, out, passes = fused(model, args)
    gm = out.exported_program().graph_module
    conv = ["aten.unsqueeze_copy.default", "aten.unsqueeze_copy.default"]
    assert op_names(gm) == [*conv, "etfuse.conv2d_bn_act.default", "aten.squeeze_copy.dims",
                            *conv, "etfuse.conv2d_act.default", "aten.squeeze_copy.dims",
                            *conv, "etfuse.conv2d_act.default", "aten.squeeze_copy.dims"]
    assert [f.rule for f in passes[0].report.fused] == ["conv1d_bn_relu", "conv1d_hardtanh", "conv1d"]
    act = [n for n in gm.graph.nodes if n.target is not None and "conv2d_act" in str(n.target)]
    assert [n.args[3:] for n in act] == [([1, 1], [0, 0], [1, 1], 8, 0.0, 6.0),
                                          ([1, 1], [0, 0], [1, 1], 1)]  # default: no clamp
    want = model(*args)
    torch.testing.assert_close(out.exported_program().module()(*args), want, **TOL)
    torch.testing.assert_close(run(out.to_executorch(), args)[0], want, **TOL)


# --------------------------------------------------------------------------------------------
# activations after the GEMM: silu, sigmoid, gelu (erf / tanh)

EAGER_ACT = {"silu": F.silu, "sigmoid": torch.sigmoid, "gelu": F.gelu,
             "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "hardswish": F.hardswish,
             "hardsigmoid": F.hardsigmoid}


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("act", sorted(EAGER_ACT))
def test_activation_kernels_match_eager(act, kernel_isa):
    """Every activation after conv2d (plain, batch norm; contiguous and channels-last output)
    and linear, on values from -90 to 90, infinities and NaN, on both ISAs."""
    g = torch.Generator().manual_seed(len(act))
    x, w, b = torch.randn(2, 6, 9, 9, generator=g) * 4, torch.randn(12, 6, 3, 3, generator=g), torch.randn(12)
    want = EAGER_ACT[act](F.conv2d(x, w, b, 1, 1))
    for inp in (x, x.to(memory_format=torch.channels_last)):
        out = torch.empty(0)
        ops.conv2d_act.out(inp, w, b, [1, 1], [1, 1], [1, 1], 1, None, None, act, out=out)
        torch.testing.assert_close(out, want, **TOL)
    s = _bn_stats(12, g)
    bn = (s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], 1e-5)
    want_bn = EAGER_ACT[act](F.batch_norm(F.conv2d(x, w, b, 1, 1), s["running_mean"], s["running_var"],
                                          s["bn_weight"], s["bn_bias"], False, 0.1, 1e-5))
    out = torch.empty(0)
    ops.conv2d_bn_act.out(x, w, b, *bn, [1, 1], [1, 1], [1, 1], 1, None, None, act, out=out)
    torch.testing.assert_close(out, want_bn, **TOL)
    # linear on inputs spanning exp's range, with the special values (inf * 0 = NaN elsewhere in their rows)
    v = torch.linspace(-90, 90, 181 * 8).reshape(-1, 8)
    v[0, 0], v[1, 1], v[2, 2] = float("inf"), float("-inf"), float("nan")
    eye = torch.eye(8)
    out = torch.empty(0)
    ops.linear_act.out(v, eye, None, None, None, act, out=out)
    # the sums and the activation element by element (IEEE: inf * 1 + 0s = inf, gelu(inf) = inf):
    # torch's vectorised AVX-512 paths give NaN for both (MKL's GEMM, gelu on 16 lanes)
    linear = (v[:, :, None] * eye.t()[None]).sum(1)
    want = torch.cat([EAGER_ACT[act](e) for e in linear.reshape(-1).split(1)]).reshape(linear.shape)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    # the pattern (what a retrace gives back) is eager's activation
    torch.testing.assert_close(LINEAR_ACT.pattern(v[3:], eye, None, None, None, act), EAGER_ACT[act](v[3:]),
                               rtol=1e-5, atol=1e-6)


def test_unknown_activation_is_an_error_that_names_it():
    out = torch.empty(0)
    with pytest.raises(RuntimeError, match=r"etfuse::linear_act.out: unknown activation 'swish' \(none, silu.*"
                                           r"hardsigmoid; gated: swiglu, geglu, geglu_tanh\)"):
        ops.linear_act.out(torch.randn(2, 3), torch.randn(4, 3), None, None, None, "swish", out=out)


class Activations(torch.nn.Module):
    """EfficientNet's conv -> bn -> SiLU, a conv -> sigmoid gate, a GELU MLP (erf, then tanh)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.gate = torch.nn.Conv2d(4, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 8, 1)
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        y = F.silu(self.bn(self.conv(x)))
        y = torch.sigmoid(self.gate(y)) * y
        z = F.gelu(self.fc1(y.mean((2, 3))))
        return y, F.gelu(self.fc2(z), approximate="tanh")


def test_activations_become_the_ops_epilogue(fused_matches_eager):
    model = _randomise_bn(Activations())
    args = (torch.randn(2, 4, 12, 12) * 3,)
    edge, out, passes = fused(model, args)
    gm = out.exported_program().graph_module
    assert op_names(gm) == ["etfuse.conv2d_bn_act.default", "etfuse.conv2d_act.default",
                            "aten.mul.Tensor", "etfuse.mean_hw.default", "etfuse.linear_act.default",
                            "etfuse.linear_act.default"]
    assert [f.rule for f in passes[0].report.fused] == ["conv2d_bn_silu", "conv2d_sigmoid", "mean_hw_2_3", "linear_gelu",
                                                        "linear_gelu_tanh_no_bias"]
    assert [n.args[-1] for n in gm.graph.nodes if "_act" in str(n.target)] == ["silu", "sigmoid", "gelu", "gelu_tanh"]
    fused_matches_eager(model, args, out, **TOL)


class HardActivations(torch.nn.Module):
    """MobileNetV3's conv -> bn -> hardswish, a squeeze-excite gate (1x1 conv -> hardsigmoid ->
    channel-wise mul) and a hardswish classifier layer."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.squeeze, self.excite, self.fc = torch.nn.Conv2d(8, 4, 1), torch.nn.Conv2d(4, 8, 1), torch.nn.Linear(8, 6)

    def forward(self, x):
        y = F.hardswish(self.bn(self.conv(x)))
        s = F.hardsigmoid(self.excite(F.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return F.hardswish(self.fc((y * s).mean((2, 3))))


def test_hardswish_and_hardsigmoid_become_the_ops_epilogue(fused_matches_eager):
    """The edge dialect spells them with lifted constants 3 and 6: fused when the program knows
    those values, on the runtime and retraced, equal to eager."""
    model = _randomise_bn(HardActivations())
    args = (torch.randn(2, 4, 10, 10) * 3,)
    edge, out, passes = fused(model, args)
    gm = out.exported_program().graph_module
    assert op_names(gm) == ["etfuse.conv2d_bn_act.default", "etfuse.mean_hw.default",
                            "etfuse.conv2d_act.default", "etfuse.conv2d_act.default", "etfuse.mul.default",
                            "etfuse.mean_hw.default", "etfuse.linear_act.default"]
    assert [f.rule for f in passes[0].report.fused] == ["conv2d_bn_hardswish", "mean_hw_keepdim_2_3", "conv2d_relu",
                                                        "conv2d_hardsigmoid", "mul_channels", "mean_hw_2_3",
                                                        "linear_hardswish"]
    fused_matches_eager(model, args, out, **TOL)


def test_other_constants_are_declined_and_graph_modules_fuse_too():
    class NotHard(torch.nn.Module):  # hardswish's shape with 2 for 3: not a hardswish
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            return y * torch.clamp(y + torch.tensor(2), 0, 6) / torch.tensor(6)

    model, args = NotHard().eval(), (torch.randn(1, 3, 5, 5),)
    edge, out, passes = fused(model, args)
    assert "etfuse.conv2d_act.default" in op_names(out.exported_program().graph_module)
    assert "conv2d_hardswish" not in [f.rule for f in passes[0].report.fused]
    torch.testing.assert_close(out.exported_program().module()(*args), model(*args), **TOL)
    # a graph module alone (ExecutorchBackendConfig.passes): a lifted constant's fake tensor
    # carries its value, so that route fuses them too
    gm = edge_program(HardActivations().eval(), (torch.randn(1, 4, 6, 6),)).exported_program().graph_module
    fusion = FusionPass()
    fusion(gm)
    assert [f.rule for f in fusion.report.fused if "hard" in f.rule] == ["conv2d_bn_hardswish", "conv2d_hardsigmoid",
                                                                         "linear_hardswish"]


def test_runtime_bad_shape_is_an_error_not_an_abort():
    """A dynamic H admits inputs the kernel cannot convolve: Method.execute fails, the process lives."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    h = torch.export.Dim("h", min=4, max=16)
    from executorch.exir import to_edge

    edge = to_edge(torch.export.export(model, (torch.randn(1, 3, 8, 8),), dynamic_shapes=({2: h},)))
    out = fuse(edge, gemm_conv_passes())
    method = load_method(out.to_executorch())
    x = torch.randn(1, 3, 5, 8)
    torch.testing.assert_close(method.execute((x,))[0], model(x), **TOL)
    with pytest.raises(Exception):
        method.execute((torch.randn(1, 3, 2, 8),))
    torch.testing.assert_close(method.execute((x,))[0], model(x), **TOL)  # still usable


# --------------------------------------------------------------------------------------------
# composition with the XNNPACK delegate


def _delegates(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and "executorch_call_delegate" in str(n.target)]


def _lower(model, x, partitioner):
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[partitioner])


def test_etfuse_fuses_what_the_partitioner_leaves():
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = _randomise_bn(ResBlock())
    x = torch.randn(1, 3, 16, 16)
    lowered = _lower(model, x, XnnpackPartitioner(configs=[ConvolutionConfig]))
    before = lowered.exported_program().graph_module
    passes = gemm_conv_passes()
    out = fuse(lowered, passes)
    gm = out.exported_program().graph_module
    # the three convolutions stay in their delegates, same lowered modules
    assert len(_delegates(gm)) == len(_delegates(before))
    assert len(_delegates(gm)) == 3
    assert [n.args[0].target for n in _delegates(gm)] == [n.args[0].target for n in _delegates(before)]
    names = op_names(gm)
    assert "etfuse.conv2d_act.default" not in names
    assert "etfuse.linear_act.default" in names  # the head: permute_copy + addmm
    # a batch norm after a delegate has no convolution to join (its input is the delegate's output)
    assert "etfuse.conv2d_bn_act.default" not in names
    assert "aten._native_batch_norm_legit_no_training.default" in names
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_delegates_are_left_alone():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = _randomise_bn(ResBlock())
    x = torch.randn(1, 3, 16, 16)
    lowered = _lower(model, x, XnnpackPartitioner())
    out = fuse(lowered, gemm_conv_passes())
    gm = out.exported_program().graph_module
    before = lowered.exported_program().graph_module
    assert len(_delegates(gm)) == len(_delegates(before))
    # the delegates stay as they are; of what XNNPACK leaves, only the global mean is etfuse's
    left = [n for n in op_names(before) if n not in ("executorch_call_delegate", "getitem")]
    assert left == ["aten.mean.dim"]
    assert [n for n in op_names(gm) if n not in ("executorch_call_delegate", "getitem")] == ["etfuse.mean_hw.default"]
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)
