"""Weights packed at fuse time: `PrepackWeightsPass` turns multi-row `linear_act` / `linear_relu`
and small-map `conv2d_act` / `conv2d_bn_act` on constant weights into their `*_packed_act` forms on
a `pack_gemm_weight` constant. Checked: the kernels against their patterns and against the
unpacked ops on every ISA, the layout, opcheck, named errors, the pass's graph and constants on
each route, and the .pte against eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import ExecutorchBackendConfig, to_edge

import etfuse
from etfuse.backend_ops import (CONV2D_ACT, CONV2D_BN_ACT, CONV2D_BN_PACKED_ACT, CONV2D_PACKED_ACT, LINEAR_ACT,
                                LINEAR_PACKED_ACT, PACK_GEMM_WEIGHT)
from etfuse.backend_ops.prepacked_ops import unpack_conv_weight, unpack_gemm_weight
from etfuse.passes import PrepackWeightsPass, default_passes
from etfuse.runtime import run
from fusion_helpers import assert_fused_matches_eager, op_names

TOL = dict(rtol=1e-5, atol=1e-5)


pytestmark = pytest.mark.usefixtures("eager_kernels")


def test_pack_layout_and_its_inverse():
    w = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)
    packed = PACK_GEMM_WEIGHT.aten(w)
    assert packed.shape == (2, 3, 16) and packed.is_contiguous()
    assert torch.equal(packed[1, 2, 3], w[19, 2]) and torch.equal(packed[0, 1, 5], w[5, 1])
    assert not packed[1, :, 4:].any()  # columns past out_features are zero
    assert torch.equal(unpack_gemm_weight(packed, 20), w)


CASES = [  # input shape, out_features, bias, min, max, activation
    ((3, 7), 5, True, None, None, "none"),
    ((37, 300), 33, True, 0.0, None, "none"),     # 2 K slices, a partial last panel
    ((2, 8, 128), 512, True, None, None, "gelu"),  # rank 3: the leading dims are the rows
    ((16, 600), 17, False, -0.5, 0.5, "none"),
    ((70, 64), 48, True, None, None, "silu"),
]


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2", "auto"], indirect=True)
def test_kernel_matches_its_pattern_and_the_unpacked_op(kernel_isa):
    g = torch.Generator().manual_seed(0)
    for shape, n, with_bias, lo, hi, act in CASES:
        x = torch.randn(shape, generator=g)
        w, b = torch.randn(n, shape[-1], generator=g), torch.randn(n, generator=g) if with_bias else None
        packed = PACK_GEMM_WEIGHT.aten(w)
        got = LINEAR_PACKED_ACT.aten_out(x, packed, n, b, lo, hi, act, out=torch.empty(0))
        torch.testing.assert_close(got, LINEAR_PACKED_ACT.pattern(x, packed, n, b, lo, hi, act), **TOL)
        torch.testing.assert_close(got, LINEAR_ACT.aten_out(x, w, b, lo, hi, act, out=torch.empty(0)), **TOL)
    # input read through strides (a transposed view)
    x = torch.randn(40, 9, generator=g).t()
    w = torch.randn(21, 40, generator=g)
    got = LINEAR_PACKED_ACT.aten_out(x, PACK_GEMM_WEIGHT.aten(w), 21, out=torch.empty(0))
    torch.testing.assert_close(got, F.linear(x, w), **TOL)


CONV_CASES = [  # input shape, Cout, kernel, stride, padding, dilation, bias, min, max, activation
    ((1, 40, 3, 3), 50, 1, 1, 0, 1, True, 0.0, None, "none"),          # 1x1 read in place
    ((2, 24, 6, 6), 33, 3, 1, 1, 1, False, None, None, "hardswish"),  # im2col, 2 images
    ((1, 16, 12, 12), 20, 3, 2, 1, 1, True, -1.0, 1.0, "none"),       # stride 2 -> 6x6
    ((1, 8, 7, 7), 17, 3, 1, 2, 2, True, None, None, "silu"),         # dilation
    ((1, 12, 5, 5), 16, 1, 2, 0, 1, True, None, None, "none"),        # a strided 1x1 goes through im2col
    ((1, 300, 3, 3), 32, 1, 1, 0, 1, True, 0.0, 6.0, "none"),        # K = 300 in one slice (gemm.h whole_k)
    # K = 360 in one slice, 40 output channels: on AVX-512 the last 16-wide panel is copied out
    # of the prepacked ones into a K-long buffer
    ((1, 40, 5, 5), 40, 3, 1, 1, 1, True, None, None, "none"),
]


def _conv_case(case, g):
    shape, cout, k, stride, padding, dilation, with_bias, lo, hi, act = case
    x = torch.randn(shape, generator=g)
    w = torch.randn(cout, shape[1], k, k, generator=g)
    b = torch.randn(cout, generator=g) if with_bias else None
    return x, w, b, [stride] * 2, [padding] * 2, [dilation] * 2, lo, hi, act


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2", "auto"], indirect=True)
def test_conv_kernels_match_their_patterns_and_the_unpacked_ops(kernel_isa):
    g = torch.Generator().manual_seed(2)
    for case in CONV_CASES:
        x, w, b, stride, padding, dilation, lo, hi, act = _conv_case(case, g)
        x = x / w[0].numel() ** 0.5  # sums of unit size at any K: 1e-5 then bounds the paths' rounding
        packed, size = PACK_GEMM_WEIGHT.aten(w), list(w.shape)
        got = CONV2D_PACKED_ACT.aten_out(x, packed, size, b, stride, padding, dilation, lo, hi, act,
                                         out=torch.empty(0))
        torch.testing.assert_close(got, CONV2D_PACKED_ACT.pattern(x, packed, size, b, stride, padding, dilation,
                                                                  lo, hi, act), **TOL)
        torch.testing.assert_close(got, CONV2D_ACT.aten_out(x, w, b, stride, padding, dilation, 1, lo, hi, act,
                                                            out=torch.empty(0)), **TOL)
        cout = w.shape[0]
        bn = (torch.rand(cout, generator=g) + 0.5, torch.randn(cout, generator=g), torch.randn(cout, generator=g),
              torch.rand(cout, generator=g) + 0.5, 1e-5)
        got = CONV2D_BN_PACKED_ACT.aten_out(x, packed, size, b, *bn, stride, padding, dilation, lo, hi, act,
                                            out=torch.empty(0))
        torch.testing.assert_close(got, CONV2D_BN_ACT.aten_out(x, w, b, *bn, stride, padding, dilation, 1, lo, hi,
                                                               act, out=torch.empty(0)), **TOL)
    # an input read through strides (channels last)
    x = torch.randn(1, 3, 3, 40, generator=g).permute(0, 3, 1, 2)
    w = torch.randn(24, 40, 1, 1, generator=g)
    got = CONV2D_PACKED_ACT.aten_out(x, PACK_GEMM_WEIGHT.aten(w), list(w.shape), None, [1, 1], [0, 0], [1, 1],
                                     out=torch.empty(0))
    torch.testing.assert_close(got, F.conv2d(x, w), **TOL)


def test_conv_weight_layout_and_named_errors():
    w = torch.randn(20, 3, 2, 2)
    packed = PACK_GEMM_WEIGHT.aten(w)
    assert packed.shape == (2, 12, 16) and torch.equal(unpack_conv_weight(packed, list(w.shape)), w)
    x, b = torch.randn(1, 3, 4, 4), torch.randn(20)
    args = (b, [1, 1], [0, 0], [1, 1])
    torch.library.opcheck(CONV2D_PACKED_ACT.aten, (x, packed, list(w.shape), *args))
    torch.library.opcheck(CONV2D_PACKED_ACT.aten_out, (x, packed, list(w.shape), *args),
                          {"out": torch.empty(1, 20, 3, 3)},
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    bn = (None, None, torch.zeros(20), torch.ones(20), 1e-5)
    torch.library.opcheck(CONV2D_BN_PACKED_ACT.aten, (x, packed, list(w.shape), b, *bn, [1, 1], [0, 0], [1, 1]))
    with pytest.raises(RuntimeError, match=r"etfuse::conv2d_packed_act.out: packed_weight \[2, 12, 16\] does not hold "
                                           r"a weight of shape \[20, 3, 3, 3\]"):
        CONV2D_PACKED_ACT.aten_out(x, packed, [20, 3, 3, 3], *args, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::conv2d_packed_act.out: weight_size must have 4 values"):
        CONV2D_PACKED_ACT.aten_out(x, packed, [20, 12], *args, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::conv2d_bn_packed_act.out: packed_weight must have shape "
                                           r"\[1, in_features, 16\] for out_features 16"):
        CONV2D_BN_PACKED_ACT.aten_out(x, packed, [16, 3, 2, 2], b[:16], *bn[:2], torch.zeros(16), torch.ones(16),
                                      1e-5, [1, 1], [0, 0], [1, 1], out=torch.empty(0))


def test_opcheck_and_named_errors():
    x, w, b = torch.randn(4, 24), torch.randn(18, 24), torch.randn(18)
    packed = PACK_GEMM_WEIGHT.aten(w)
    torch.library.opcheck(PACK_GEMM_WEIGHT.aten, (w,))
    torch.library.opcheck(LINEAR_PACKED_ACT.aten, (x, packed, 18, b, 0.0, None, "none"))
    torch.library.opcheck(LINEAR_PACKED_ACT.aten_out, (x, packed, 18, b), {"out": torch.empty(4, 18)},
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_packed_act: packed_weight must have shape "
                                           r"\[1, in_features, 16\] for out_features 16"):
        LINEAR_PACKED_ACT.aten_out(x, packed, 16, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"linear_packed_act: packed_weight must be contiguous"):
        LINEAR_PACKED_ACT.aten_out(x, packed.transpose(0, 1).contiguous().transpose(0, 1), 18, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"input shape \[4, 23\] and weight shape \[18, 24\] do not match"):
        LINEAR_PACKED_ACT.aten_out(torch.randn(4, 23), packed, 18, out=torch.empty(0))


class TwoLinears(torch.nn.Module):
    """A 3-D MLP whose weight `a` is also used by a one-row linear (the packed copy is shared by
    the two multi-row uses; the one-row use keeps the weight as stored)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 40), torch.nn.Linear(40, 24)

    def forward(self, x, token):
        h = self.b(torch.relu(self.a(x)))
        return h, self.a(x * 2.0), self.a(token)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 5, 64, generator=g), torch.randn(1, 64, generator=g)


def test_fuse_packs_multi_row_linears_once_per_weight(fused_matches_eager):
    torch.manual_seed(0)
    model, args = TwoLinears().eval(), _inputs()
    edge = to_edge(torch.export.export(model, args))
    before = op_names(edge.exported_program().graph_module)
    fused = etfuse.fuse(edge)
    ep = fused.exported_program()
    ops = op_names(ep.graph_module)
    assert ops.count("etfuse.linear_packed_act.default") == 3
    assert ops.count("etfuse.linear_act.default") == 1  # the one-row linear
    assert "etfuse.pack_gemm_weight.default" not in ops  # folded into constants
    shapes = sorted(tuple(t.shape) for t in ep.constants.values())
    assert shapes == [(2, 40, 16), (3, 64, 16)]  # a's panels once, for its two multi-row uses
    assert "a.weight" in ep.state_dict and "b.weight" not in ep.state_dict  # b's only reader is packed
    assert op_names(edge.exported_program().graph_module) == before  # the caller's program is as it was
    fused_matches_eager(model, args, fused, **TOL)


def test_transform_packs_and_the_backend_config_route_keeps_the_weights():
    torch.manual_seed(0)
    model, args = TwoLinears().eval(), _inputs()
    edge = to_edge(torch.export.export(model, args))
    transformed = edge.transform(default_passes())
    assert op_names(transformed.exported_program().graph_module).count("etfuse.linear_packed_act.default") == 3
    program = copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    names = [o.name for o in program.executorch_program.execution_plan[0].operators]
    assert "etfuse::linear_act" in names and "etfuse::linear_packed_act" not in names  # no values: no packing
    want = model(*args)
    for outs in (run(program, args), run(transformed.to_executorch(), args)):
        for a, b in zip(outs, want):
            torch.testing.assert_close(a, b, **TOL)


def test_pass_on_a_graph_module_changes_nothing():
    torch.manual_seed(0)
    edge = to_edge(torch.export.export(TwoLinears().eval(), _inputs()))
    gm = edge.exported_program().graph_module
    res = PrepackWeightsPass()(gm)
    assert res.graph_module is not gm and res.modified  # executorch keeps the caller's module otherwise
    assert op_names(res.graph_module) == op_names(gm)


def test_dynamic_rows_are_packed_where_they_can_reach_min_rows():
    """Symbolic rows that may reach MIN_ROWS get the packed weight (the kernel takes any row
    count, one row included); rows that provably stay under it keep the dot-product path."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).eval()
    for rows, packed in ((torch.export.Dim("rows", min=1, max=64), True), (torch.export.Dim("few", min=1, max=2), False)):
        fused = etfuse.fuse(to_edge(torch.export.export(model, (torch.randn(2, 32),), dynamic_shapes=({0: rows},))))
        ops = op_names(fused.exported_program().graph_module)
        assert ("etfuse.linear_packed_act.default" in ops) == packed, ops
        assert ("etfuse.linear_relu.default" in ops) != packed, ops
        program = fused.to_executorch()
        for m in {1, 2, rows.max}:
            x = torch.randn(m, 32)
            torch.testing.assert_close(run(program, (x,))[0], model(x), **TOL)


def test_a_dynamic_batch_packs_small_map_convs():
    """The output map decides a conv's packing; a symbolic batch does not stop it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU()).eval()
    batch = torch.export.Dim("batch", min=1, max=4)
    fused = etfuse.fuse(to_edge(torch.export.export(model, (torch.randn(2, 16, 6, 6),), dynamic_shapes=({0: batch},))))
    assert "etfuse.conv2d_packed_act.default" in op_names(fused.exported_program().graph_module)
    program = fused.to_executorch()
    for n in (1, 3, 4):
        x = torch.randn(n, 16, 6, 6)
        torch.testing.assert_close(run(program, (x,))[0], model(x), **TOL)


def test_relu_linear_becomes_packed_with_its_clamp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 20), torch.nn.ReLU()).eval()
    x = torch.randn(9, 48)
    fused = etfuse.fuse(to_edge(torch.export.export(model, (x,))))
    (node,) = [n for n in fused.exported_program().graph.nodes if "linear_packed_act" in str(n.target)]
    assert node.args[2:] == (20, node.args[3], 0.0, None, "none")
    assert_fused_matches_eager(model, (x,), fused, **TOL)


class SmallMapCNN(torch.nn.Module):
    """On a 6x6 map: a 3x3 conv+bn+relu6 with 16 outputs (stays: the phase-plane GEMM is faster
    there), a depthwise conv (stays), a 1x1 conv+bn (packed), a 1x1 conv (packed), a 3x3 with 128
    outputs (packed) and a stride-2 3x3 to a 3x3 map (packed); on 15x15 a 3x3 (stays) and a 1x1
    (packed); a 1x1 on 16x16 (stays: the implicit GEMM reads the planes in place)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)  # 12x12 -> 6x6
        self.bn = torch.nn.BatchNorm2d(16)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = torch.nn.Conv2d(16, 24, 1)
        self.pw_bn = torch.nn.BatchNorm2d(24)
        self.pw2 = torch.nn.Conv2d(24, 24, 1)
        self.big = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.big_pw = torch.nn.Conv2d(8, 8, 1)
        self.wide = torch.nn.Conv2d(8, 4, 1)
        self.many = torch.nn.Conv2d(24, 128, 3, padding=1)
        self.tail = torch.nn.Conv2d(24, 32, 3, stride=2, padding=1)

    def forward(self, x, y, z):
        h = F.relu6(self.bn(self.stem(x)))
        h = F.relu(self.pw_bn(self.pw(F.relu(self.dw(h)))))
        return self.pw2(h), self.big_pw(F.relu(self.big(y))), self.wide(z), self.many(h), self.tail(h)


def test_fuse_packs_small_map_convs(fused_matches_eager):
    from fusion_helpers import eval_with_bn_stats

    torch.manual_seed(0)
    model = eval_with_bn_stats(SmallMapCNN())
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(1, 8, 12, 12, generator=g), torch.randn(1, 8, 15, 15, generator=g),
            torch.randn(1, 8, 16, 16, generator=g))
    fused = etfuse.fuse(to_edge(torch.export.export(model, args)))
    ep = fused.exported_program()
    assert sorted(op_names(ep.graph_module)) == sorted([
        "etfuse.conv2d_bn_act.default", "etfuse.conv2d_act.default", "etfuse.conv2d_bn_packed_act.default",
        "etfuse.conv2d_packed_act.default", "etfuse.conv2d_act.default", "etfuse.conv2d_packed_act.default",
        "etfuse.conv2d_act.default", "etfuse.conv2d_packed_act.default", "etfuse.conv2d_packed_act.default"])
    assert sorted(tuple(t.shape) for t in ep.constants.values()) == [
        (1, 8, 16), (2, 16, 16), (2, 24, 16), (2, 216, 16), (8, 216, 16)]
    fused_matches_eager(model, args, fused, **TOL)
