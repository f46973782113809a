"""int8 conv2d and linear from PT2E (XNNPACK quantizer, per-channel weights):
`etfuse::quantized_conv2d` / `quantized_linear` and their packed forms. Checked: the kernels bit
for bit against the ops' patterns (int8 and uint8, every ISA), the patterns against an exact
integer reference, opcheck, the fused graph op for op, the `.pte` on the runtime against the PT2E
model in eager, the retrace, what PrepackWeightsPass packs, and named errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from executorch.exir import to_edge

import etfuse
from etfuse.backend_ops import (PACK_GEMM_WEIGHT, QUANTIZED_CONV2D, QUANTIZED_CONV2D_PACKED, QUANTIZED_LINEAR,
                                QUANTIZED_LINEAR_PACKED)
from etfuse.patterns.quantized_gemm_rules import output_range
from etfuse.runtime import run
from fusion_helpers import eval_with_bn_stats, op_names, pt2e_int8

I8, U8 = torch.int8, torch.uint8


pytestmark = pytest.mark.usefixtures("eager_kernels")


def _range(dtype):
    return (-128, 127) if dtype == I8 else (0, 255)


def _conv_args(g, dtype, n, c, h, w, cout, k, stride, padding, dilation, groups, bias=True, zero_points=True):
    lo, hi = _range(dtype)
    x = torch.randint(lo, hi + 1, (n, c, h, w), dtype=dtype, generator=g)
    wt = torch.randint(-127, 128, (cout, c // groups, k, k), dtype=I8, generator=g)
    zp = torch.randint(-4, 5, (cout,), generator=g) if zero_points else None
    return (x, 0.0213, int(torch.randint(lo, hi, (), generator=g)), wt, torch.rand(cout, generator=g) * 0.01 + 1e-4,
            zp, torch.randn(cout, generator=g) if bias else None, [stride, stride], [padding, padding],
            [dilation, dilation], groups, 0.0731, int(torch.randint(lo, hi, (), generator=g)), lo + 2, hi - 3)


CONV_CASES = [  # n, c, h, w, cout, k, stride, padding, dilation, groups
    (1, 8, 10, 10, 16, 3, 1, 1, 1, 1),
    (2, 16, 9, 7, 24, 3, 2, 1, 1, 1),     # two images, odd map
    (1, 32, 12, 12, 32, 3, 1, 1, 1, 32),  # depthwise
    (1, 64, 6, 6, 96, 1, 1, 0, 1, 1),     # pointwise on a small map
    (1, 3, 33, 33, 16, 3, 2, 1, 1, 1),    # a stem
    (1, 16, 8, 8, 16, 3, 1, 2, 2, 4),     # grouped, dilated
    (1, 6, 11, 13, 10, 3, 3, 2, 2, 1),    # stride 3, dilated (VNNI: over the im2col, gathered byte by byte)
    # pointwise (the VNNI kernel where the CPU has it and the weight zero points are 0; groups-1
    # spatial convs run it over their im2col):
    (2, 13, 7, 9, 37, 1, 1, 0, 1, 1),     # K not a multiple of 4, 63 pixels (48 + 15), 37 channels
    (1, 24, 5, 5, 200, 1, 1, 0, 1, 1),    # few pixels: blocks of output channels in parallel
    (1, 16, 20, 20, 24, 1, 1, 0, 1, 1),   # 400 pixels: 9 tiles, the last one a single vector
    # depthwise (the AVX-512 int8 kernels where the CPU has it: stride 1 or 2, dilation 1; 16
    # channels a vector on maps of up to 576 outputs):
    (2, 24, 17, 37, 24, 3, 2, 1, 1, 24),  # stride 2 on odd sizes, 19-wide output rows (16 + 3)
    (1, 16, 9, 9, 16, 5, 1, 2, 1, 16),    # 5x5
    (1, 8, 21, 19, 8, 3, 2, 0, 1, 8),     # stride 2 without padding
    (1, 40, 9, 9, 40, 3, 1, 1, 1, 40),    # 81 outputs: 6 vectors a plane
    (2, 37, 3, 3, 37, 3, 1, 1, 1, 37),    # a 3x3 map: 16 channels a vector, the last block of 5
    (1, 20, 12, 13, 20, 3, 2, 1, 1, 20),  # stride 2 to 6x7: 42 pixels (16 + 16 + 10)
    (1, 16, 6, 6, 16, 5, 1, 2, 1, 16),    # 5x5 on 6x6
    (1, 16, 40, 50, 16, 3, 1, 1, 1, 16),  # maps over 576 outputs run plane by plane: 50-wide rows, 4 vectors
    (1, 8, 60, 70, 8, 3, 2, 1, 1, 8),     # plane by plane, stride 2 to 30x35
    (1, 8, 30, 30, 8, 5, 1, 2, 1, 8),     # plane by plane, 5x5
]


# "auto": the AVX-512 int8 kernels (VNNI 1x1, depthwise) where the CPU has them; "avx2" and
# "baseline": the float path (integers on the float conv cores, then requantized)
POINTWISE = [c for c in CONV_CASES if c[5] == 1]
DEPTHWISE = [c for c in CONV_CASES if c[-1] == c[1] > 1]


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2", "auto"], indirect=True)
@pytest.mark.parametrize("dtype", [I8, U8])
def test_conv_kernel_is_bit_exact_with_its_pattern(kernel_isa, dtype):
    g = torch.Generator().manual_seed(0)
    for case in CONV_CASES:
        for bias, zps in ((True, True), (False, False)):
            args = _conv_args(g, dtype, *case, bias=bias, zero_points=zps)
            got = QUANTIZED_CONV2D.aten_out(*args, out=torch.empty(0, dtype=dtype))
            assert got.dtype == dtype
            assert torch.equal(got, QUANTIZED_CONV2D.pattern(*args)), (case, bias)
    # input read through strides (channels-last storage), spatial and pointwise
    for case in (CONV_CASES[0], POINTWISE[-1], DEPTHWISE[-1]):
        args = _conv_args(g, dtype, *case, zero_points=False)
        x = args[0].to(memory_format=torch.channels_last)
        got = QUANTIZED_CONV2D.aten_out(x, *args[1:], out=torch.empty(0, dtype=dtype))
        assert torch.equal(got, QUANTIZED_CONV2D.pattern(*args)), case


def test_pattern_accumulates_integers_exactly():
    """The op's arithmetic: an exact integer sum (float64 here), then float32 steps."""
    g = torch.Generator().manual_seed(1)
    x, xs, xz, w, ws, wz, b, stride, padding, dilation, groups, os_, oz, omin, omax = _conv_args(g, I8, *CONV_CASES[1])
    acc = torch.nn.functional.conv2d((x.double() - xz), (w.double() - wz.double().view(-1, 1, 1, 1)), None, stride,
                                     padding, dilation, groups).float()
    y = acc * (ws * xs).view(1, -1, 1, 1) + b.view(1, -1, 1, 1)
    want = torch.clamp(torch.round(y * (1.0 / os_)) + oz, omin, omax).to(I8)
    assert torch.equal(QUANTIZED_CONV2D.pattern(x, xs, xz, w, ws, wz, b, stride, padding, dilation, groups, os_, oz,
                                                 omin, omax), want)


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2", "auto"], indirect=True)
def test_linear_kernels_and_packed_forms_are_bit_exact(kernel_isa):
    g = torch.Generator().manual_seed(2)
    for rows, k, n in ((1, 1280, 1000), (3, 40, 33), (4, 64, 17), (37, 300, 48), (2, 5, 7)):
        for dtype in (I8, U8):
            lo, hi = _range(dtype)
            x = torch.randint(lo, hi + 1, (rows, k), dtype=dtype, generator=g)
            w = torch.randint(-127, 128, (n, k), dtype=I8, generator=g)
            ws, b = torch.rand(n, generator=g) * 1e-3, torch.randn(n, generator=g)
            args = (x, 0.03, lo + 5, w, ws, None, b, 0.07, lo + 9, lo, hi)
            want = QUANTIZED_LINEAR.pattern(*args)
            assert torch.equal(QUANTIZED_LINEAR.aten_out(*args, out=torch.empty(0, dtype=dtype)), want)
            packed = (x, 0.03, lo + 5, PACK_GEMM_WEIGHT.aten(w), n, ws, b, 0.07, lo + 9, lo, hi)
            assert torch.equal(QUANTIZED_LINEAR_PACKED.pattern(*packed), want)
            assert torch.equal(QUANTIZED_LINEAR_PACKED.aten_out(*packed, out=torch.empty(0, dtype=dtype)), want), \
                (rows, k, n, dtype)
    # with VNNI, on the panels regrouped (pointwise, and spatial over the im2col)
    for case in (*[c for c in CONV_CASES if c[-1] == 1], (1, 160, 3, 3, 960, 1, 1, 0, 1, 1)):
        for dtype in (I8, U8):
            args = _conv_args(g, dtype, *case, zero_points=False)
            want = QUANTIZED_CONV2D.pattern(*args)
            x, xs, xz, w, ws, _, b, stride, padding, dilation, groups, os_, oz, omin, omax = args
            if groups != 1:
                continue
            packed = (x, xs, xz, PACK_GEMM_WEIGHT.aten(w), list(w.shape), ws, b, stride, padding, dilation, os_,
                      oz, omin, omax)
            assert torch.equal(QUANTIZED_CONV2D_PACKED.pattern(*packed), want)
            got = QUANTIZED_CONV2D_PACKED.aten_out(*packed, out=torch.empty(0, dtype=dtype))
            assert torch.equal(got, want), (case, dtype)


def test_opcheck():
    g = torch.Generator().manual_seed(3)
    args = _conv_args(g, I8, *CONV_CASES[0])
    torch.library.opcheck(QUANTIZED_CONV2D.aten, args)
    x, xs, xz, w, ws, _, b, stride, padding, dilation, _, os_, oz, omin, omax = args
    torch.library.opcheck(QUANTIZED_CONV2D_PACKED.aten, (x, xs, xz, PACK_GEMM_WEIGHT.aten(w), list(w.shape), ws, b,
                                                          stride, padding, dilation, os_, oz, omin, omax))
    xl, wl = torch.randint(-128, 128, (3, 20), dtype=I8), torch.randint(-127, 128, (9, 20), dtype=I8)
    torch.library.opcheck(QUANTIZED_LINEAR.aten, (xl, 0.1, 2, wl, torch.rand(9), None, None, 0.2, -1, -128, 127))
    torch.library.opcheck(QUANTIZED_LINEAR_PACKED.aten,
                          (xl, 0.1, 2, PACK_GEMM_WEIGHT.aten(wl), 9, torch.rand(9), torch.randn(9), 0.2, -1, -128, 127))


def test_errors_name_the_op_and_the_argument():
    g = torch.Generator().manual_seed(4)
    args = list(_conv_args(g, I8, *CONV_CASES[0]))
    bad = list(args)
    bad[3] = args[3].float()
    with pytest.raises(RuntimeError, match=r"etfuse::quantized_conv2d.out: weight must be int8, got Float"):
        QUANTIZED_CONV2D.aten_out(*bad, out=torch.empty(0, dtype=I8))
    with pytest.raises(RuntimeError, match=r"quantized_conv2d.out: out has dtype Byte, the input Char"):
        QUANTIZED_CONV2D.aten_out(*args, out=torch.empty(0, dtype=U8))
    bad = list(args)
    bad[4] = args[4][:3]
    with pytest.raises(RuntimeError, match=r"weight_scale must be \[N\] or \[N, 1\]"):
        QUANTIZED_CONV2D.aten_out(*bad, out=torch.empty(0, dtype=I8))
    bad = list(args)
    bad[13], bad[14] = 10, 5
    with pytest.raises(RuntimeError, match=r"output range \[10, 5\] is empty"):
        QUANTIZED_CONV2D.aten_out(*bad, out=torch.empty(0, dtype=I8))


# ---- PT2E models, fused end to end ------------------------------------------------------------

class SmallQuantNet(nn.Module):
    """A stem with relu6, a depthwise + pointwise pair, a residual add, global pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.ReLU())
        self.pw = nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.pw(self.dw(y))
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def quantized_net():
    torch.manual_seed(0)
    args = (torch.randn(1, 3, 12, 12),)
    return pt2e_int8(eval_with_bn_stats(SmallQuantNet()), args), args


def test_every_conv_and_linear_becomes_one_quantized_op(quantized_net):
    ep, args = quantized_net
    fused = etfuse.fuse(to_edge(ep))
    ops = [n.split(".")[1] if n.startswith(("etfuse.", "quantized_decomposed.")) else n
           for n in op_names(fused.exported_program().graph_module)]
    assert ops == ["quantize_per_tensor",          # the float input
                   "quantized_conv2d_packed",      # stem + bn + relu6 (6x6 map: packed)
                   "quantized_conv2d",             # depthwise + relu
                   "quantized_conv2d_packed",      # pointwise
                   "add",                          # quantized residual add
                   "dequantize_per_tensor", "mean_hw", "quantize_per_tensor",
                   "quantized_linear_packed",
                   "dequantize_per_tensor"], ops


def test_runtime_matches_the_pt2e_model_and_the_retrace(quantized_net):
    ep, args = quantized_net
    fused = etfuse.fuse(to_edge(ep))
    want = ep.module()(*args)
    got = run(fused.to_executorch(), args)[0]
    # the q/dq reference rounds each float32 product; the kernels sum integers exactly: at most
    # one output step apart, and on this model not at all
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    retraced = fused.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced.graph_module) if n.startswith("etfuse.quantized")]
    assert torch.equal(retraced.module()(*args), fused.exported_program().module()(*args))


def test_activation_ranges_fold_exactly():
    b = dict(out_scale=0.05, out_zero_point=-10, out_quant_min=-128, out_quant_max=127)
    assert output_range("none", b) == (-128, 127)
    assert output_range("relu", b) == (-10, 127)                          # quantize(0) = zero point
    assert output_range("hardtanh", {**b, "lo": 0.0, "hi": 6.0}) == (-10, 110)  # round(6 / 0.05) - 10
    assert output_range("hardtanh", {**b, "lo": -100.0, "hi": 100.0}) == (-128, 127)
    mid = dict(mid_quant_min=-100, mid_quant_max=100)
    assert output_range("relu", {**b, **mid}) == (-10, 100)
    for act, extra in (("relu", {}), ("hardtanh", {"lo": -0.3, "hi": 0.45})):
        y = torch.linspace(-8, 8, 2001)
        qd = torch.ops.quantized_decomposed
        ref_act = torch.relu(y) if act == "relu" else torch.clamp(y, extra["lo"], extra["hi"])
        want = qd.quantize_per_tensor.default(ref_act, 0.05, -10, -128, 127, I8)
        lo, hi = output_range(act, {**b, **extra})
        assert torch.equal(qd.quantize_per_tensor.default(y, 0.05, -10, lo, hi, I8), want)


def test_without_prepacking_the_unpacked_ops_give_the_same_numbers(quantized_net):
    from etfuse.passes import PrepackWeightsPass, default_passes

    ep, args = quantized_net
    fused = etfuse.fuse(to_edge(ep))
    unpacked = etfuse.fuse(to_edge(ep), [p for p in default_passes() if not isinstance(p, PrepackWeightsPass)])
    names = op_names(unpacked.exported_program().graph_module)
    assert "etfuse.quantized_conv2d_packed.default" not in names and "etfuse.quantized_linear.default" in names
    torch.testing.assert_close(run(unpacked.to_executorch(), args)[0], run(fused.to_executorch(), args)[0],
                               rtol=0, atol=0)
