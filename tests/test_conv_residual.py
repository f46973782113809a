"""A convolution's residual add in its epilogue (patterns/conv_residual_rules.py): the kernels of
conv2d_act / conv2d_bn_act / their packed forms against eager on every conv path, the ops'
opcheck, the fused graphs of a ResNet block and a MobileNetV2 inverted residual through
`etfuse.fuse`, their numbers on the ExecuTorch runtime, the retrace, and what is declined.
(kernels/csrc/ops/conv2d_*.cpp, backend_ops/gemm_conv_ops.py and prepacked_ops.py)"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import assert_expected_inline

import etfuse
from etfuse.backend_ops import CONV2D_ACT
from etfuse.passes import FusionPass, fuse
from etfuse.runtime import run
from fusion_helpers import edge_program, eval_with_bn_stats, op_names

ops = torch.ops.etfuse
TOL = dict(rtol=1e-4, atol=1e-4)


# The C++ kernels on the `.out` ops: without them `.out` runs the pattern, whatever the order.
pytestmark = pytest.mark.usefixtures("eager_kernels")

# N, C, H, W, Cout, KH, KW, stride, padding, dilation, groups: one case per conv path of
# kernels/csrc/core/conv2d.h (run_paths), each of which adds the residual its own way
CASES = {
    "phase_planes": (2, 16, 20, 18, 24, 3, 3, (1, 1), (1, 1), (1, 1), 1),  # tap_tile, channel blocks
    "phase_bands": (1, 16, 64, 40, 32, 3, 3, (2, 2), (2, 2), (2, 2), 1),  # tap_tile, bands of rows in parallel
    "implicit_gemm": (1, 16, 32, 32, 32, 1, 1, (2, 2), (0, 0), (1, 1), 1),  # a 1x1 stride 2: gemm epilogue
    "pointwise_in_place": (1, 32, 16, 16, 40, 1, 1, (1, 1), (0, 0), (1, 1), 1),  # B read in place
    "grouped_gemm": (2, 20, 25, 5, 24, 1, 1, (1, 1), (0, 0), (1, 1), 2),
    "small_map": (2, 64, 3, 3, 42, 3, 3, (1, 1), (1, 1), (1, 1), 1),  # dot products, transposed
    "depthwise": (2, 16, 12, 12, 16, 3, 3, (1, 1), (1, 1), (1, 1), 16),  # no epilogue: added after
    "depthwise_small": (1, 24, 6, 6, 24, 3, 3, (1, 1), (1, 1), (1, 1), 24),
    "depthwise_multiplier": (1, 5, 7, 7, 10, 5, 5, (1, 1), (2, 2), (2, 2), 5),
}
BOUNDS = ((None, None), (0.0, None), (-0.5, 0.5))


def _case(name):
    n, c, h, w, cout, kh, kw, stride, padding, dilation, groups = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(n, c, h, w, generator=g)
    weight, bias = torch.randn(cout, c // groups, kh, kw, generator=g), torch.randn(cout, generator=g)
    conv = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    residual = torch.randn(conv.shape, generator=g)
    return x, weight, bias, (list(stride), list(padding), list(dilation), groups), conv, residual


def _want(y, residual, lo, hi):
    y = y + residual
    return y if lo is None and hi is None else y.clamp(lo, hi)


def _residual_layouts(residual):
    """The residual as given (contiguous), channels-last, and a transposed view: the kernel reads
    each at out's offsets, copying it where its strides differ."""
    return (residual, residual.to(memory_format=torch.channels_last),
            residual.transpose(2, 3).contiguous().transpose(2, 3))


@pytest.mark.parametrize("kernel_isa", ["auto", "avx2", "baseline"], indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv2d_act_residual_matches_eager(name, kernel_isa):
    """Every path, on every ISA (the SSE2 baseline runs the direct kernel, which adds the residual
    after the conv), with the residual in three layouts."""
    x, weight, bias, (stride, padding, dilation, groups), conv, residual = _case(name)
    for lo, hi in BOUNDS:
        want = _want(conv, residual, lo, hi)
        for r in _residual_layouts(residual):
            out = torch.empty(0)
            ops.conv2d_act.out(x, weight, bias, stride, padding, dilation, groups, lo, hi, "none", r, out=out)
            torch.testing.assert_close(out, want, **TOL)
        # the pattern (what a retrace gives back) adds the residual before the clamp too
        torch.testing.assert_close(
            CONV2D_ACT.pattern(x, weight, bias, stride, padding, dilation, groups, lo, hi, "none", residual), want,
            **TOL)


def _bn(cout, g):
    return dict(bn_weight=torch.randn(cout, generator=g), bn_bias=torch.randn(cout, generator=g),
                running_mean=torch.randn(cout, generator=g), running_var=torch.rand(cout, generator=g) + 0.5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv2d_bn_act_and_packed_residual_match_eager(name):
    """The batch norm's scale and shift, then the residual, then the clamp; and the packed ops
    (groups 1: the transposed GEMM, its residual added after the tile's transpose)."""
    x, weight, bias, (stride, padding, dilation, groups), _, residual = _case(name)
    s, eps = _bn(weight.shape[0], torch.Generator().manual_seed(1)), 1e-3
    normed = F.batch_norm(F.conv2d(x, weight, bias, stride, padding, dilation, groups), s["running_mean"],
                          s["running_var"], s["bn_weight"], s["bn_bias"], False, 0.0, eps)
    bn = (s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], eps)
    for lo, hi in BOUNDS:
        want = _want(normed, residual, lo, hi)
        out = torch.empty(0)
        ops.conv2d_bn_act.out(x, weight, bias, *bn, stride, padding, dilation, groups, lo, hi, "none", residual,
                              out=out)
        torch.testing.assert_close(out, want, **TOL)
        if groups != 1:
            continue
        packed = ops.pack_gemm_weight(weight)
        out = torch.empty(0)
        ops.conv2d_bn_packed_act.out(x, packed, list(weight.shape), bias, *bn, stride, padding, dilation, lo, hi,
                                     "none", residual, out=out)
        torch.testing.assert_close(out, want, **TOL)
        plain = _want(F.conv2d(x, weight, bias, stride, padding, dilation), residual, lo, hi)
        out = torch.empty(0)
        ops.conv2d_packed_act.out(x, packed, list(weight.shape), bias, stride, padding, dilation, lo, hi, "none",
                                  residual, out=out)
        torch.testing.assert_close(out, plain, **TOL)


def test_residual_with_activation_and_strided_out():
    """The activation comes after the add (activation(clamp(conv + r))); out given channels-last
    (written in its strides, the residual copied to match) and out that is the residual itself
    (written through a temporary: every residual value is read before it is overwritten)."""
    x, weight, bias, (stride, padding, dilation, groups), conv, residual = _case("phase_planes")
    args = (x, weight, bias, stride, padding, dilation, groups)
    want = F.silu(conv + residual)
    out = torch.empty(0)
    ops.conv2d_act.out(*args, None, None, "silu", residual, out=out)
    torch.testing.assert_close(out, want, **TOL)
    out = torch.empty(conv.shape).to(memory_format=torch.channels_last)
    ops.conv2d_act.out(*args, 0.0, None, "none", residual, out=out)
    torch.testing.assert_close(out, (conv + residual).relu(), **TOL)
    assert out.is_contiguous(memory_format=torch.channels_last)
    aliased = residual.clone()
    ops.conv2d_act.out(*args, 0.0, None, "none", aliased, out=aliased)
    torch.testing.assert_close(aliased, (conv + residual).relu(), **TOL)


def test_residual_of_another_shape_is_an_error_that_names_it():
    x, weight, bias, (stride, padding, dilation, groups), conv, _ = _case("phase_planes")
    with pytest.raises(RuntimeError, match=r"etfuse::conv2d_act.out: residual must have the output's shape"):
        ops.conv2d_act.out(x, weight, bias, stride, padding, dilation, groups, None, None, "none",
                           torch.randn(conv.shape[0], conv.shape[1], 1, 1), out=torch.empty(0))


def test_residual_ops_pass_opcheck(opcheck):
    x, w, b = torch.randn(2, 3, 7, 7), torch.randn(6, 3, 3, 3), torch.randn(6)
    r = torch.randn(2, 6, 7, 7)
    s = _bn(6, torch.Generator().manual_seed(0))
    bn = (s["bn_weight"], s["bn_bias"], s["running_mean"], s["running_var"], 1e-5)
    geometry = ([1, 1], [1, 1], [1, 1])
    packed = ops.pack_gemm_weight(w)
    for op, args in (
        (ops.conv2d_act, (x, w, b, *geometry, 1, 0.0, None, "none", r)),
        (ops.conv2d_bn_act, (x, w, b, *bn, *geometry, 1, 0.0, 6.0, "none", r)),
        (ops.conv2d_packed_act, (x, packed, list(w.shape), b, *geometry, None, None, "none", r)),
        (ops.conv2d_bn_packed_act, (x, packed, list(w.shape), b, *bn, *geometry, 0.0, None, "none", r)),
    ):
        opcheck(op.default, args)
        opcheck.out(op.out, args, torch.empty(r.shape))


# --------------------------------------------------------------------------------------------
# graphs


def _with_bn(model):
    """eval_with_bn_stats, and affine parameters of their own per batch norm: equal constants
    would be one constant to executorch, and which name it keeps is not fixed."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g))
    return eval_with_bn_stats(model)


class BasicBlock(nn.Module):
    """ResNet's basic block: relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)), the shortcut a
    strided 1x1 conv (no batch norm, as mlperf_tiny's ResNet8) where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.shortcut(x))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: x + bn(conv1x1(relu6(bn(dw(relu6(bn(conv1x1(x)))))))), no relu after."""

    def __init__(self, c, expand):
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.body(x)


def test_resnet_blocks_through_fuse():
    """Two blocks, the second with a shortcut conv: each block's add and relu are the epilogue
    of its last conv with batch norm, the shortcut conv's output its residual."""
    model = _with_bn(nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)))
    x = torch.randn(1, 8, 16, 16)
    edge = edge_program(model, (x,))
    out = etfuse.fuse(edge)
    ep = out.exported_program()
    assert op_names(ep.graph_module) == [
        "etfuse.conv2d_bn_act.default", "etfuse.conv2d_bn_act.default",
        "etfuse.conv2d_bn_act.default", "etfuse.conv2d_packed_act.default", "etfuse.conv2d_bn_act.default"]
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert_expected_inline("\n".join(str(n.format_node()) for n in (calls[1], calls[4])), """\
%etfuse_conv2d_bn_act_default_1 : [num_users=2] = call_function[target=executorch.exir.dialects.backend._ops.etfuse.conv2d_bn_act.default](args = (%etfuse_conv2d_bn_act_default, %p_0_c2_weight, None, %p_0_b2_weight, %p_0_b2_bias, %b_0_b2_running_mean, %b_0_b2_running_var, 1e-05, [1, 1], [1, 1], [1, 1], 1, 0.0, None, none, %input_1), kwargs = {})
%etfuse_conv2d_bn_act_default_3 : [num_users=1] = call_function[target=executorch.exir.dialects.backend._ops.etfuse.conv2d_bn_act.default](args = (%etfuse_conv2d_bn_act_default_2, %p_1_c2_weight, None, %p_1_b2_weight, %p_1_b2_bias, %b_1_b2_running_mean, %b_1_b2_running_var, 1e-05, [1, 1], [1, 1], [1, 1], 1, 0.0, None, none, %etfuse_conv2d_packed_act_default), kwargs = {})""")
    # the caller's program keeps its adds
    assert op_names(edge.exported_program().graph_module).count("aten.add.Tensor") == 2
    want = model(x)
    retraced = ep.run_decompositions()  # before to_executorch, which rewrites the graph in place
    names = op_names(retraced.graph_module)
    assert not [n for n in names if n.startswith("etfuse.")], names
    assert names.count("aten.add.Tensor") == 2
    torch.testing.assert_close(retraced.module()(x), want, **TOL)
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], want, **TOL)


def test_inverted_residual_packed_on_a_small_map():
    """No relu after the add; on an 8x8 map the projection conv's weight is packed at fuse time
    (PrepackWeightsPass), and its residual goes with it to conv2d_bn_packed_act."""
    model = _with_bn(InvertedResidual(16, 4))
    x = torch.randn(1, 16, 8, 8)
    out = etfuse.fuse(edge_program(model, (x,)))
    gm = out.exported_program().graph_module
    assert op_names(gm) == [
        "etfuse.conv2d_bn_packed_act.default", "etfuse.conv2d_bn_act.default",
        "etfuse.conv2d_bn_packed_act.default"]
    last = [n for n in gm.graph.nodes if n.op == "call_function"][-1]
    assert last.args[-4:-1] == (None, None, "none")
    assert last.args[-1].name == "x"
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_the_add_s_other_operand_when_the_first_is_read_elsewhere():
    """x + body(x) with x itself a conv + batch norm (the block before projects without an
    activation): matched as written, the pattern's conv is x, whose output the body reads too;
    the engine then tries the add's operands the other way round, and body's last conv takes
    the residual."""
    model = _with_bn(nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), InvertedResidual(16, 2)))
    x = torch.randn(1, 8, 10, 10)
    p = FusionPass()
    out = fuse(edge_program(model, (x,)), [p])
    assert [f.rule for f in p.report.fused] == ["conv2d_bn", "conv2d_bn_hardtanh", "conv2d_bn_hardtanh",
                                                "conv2d_bn_residual"]
    gm = out.exported_program().graph_module
    first, *_, last = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert last.args[-1] is first  # the residual is the first conv's output
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_routes_give_the_same_program():
    """transform(default_passes()) and ExecutorchBackendConfig(passes=...) fuse it too."""
    from executorch.exir import ExecutorchBackendConfig

    model = _with_bn(BasicBlock(8, 8, 1))
    x = torch.randn(1, 8, 12, 12)
    want = model(x)
    by_transform = edge_program(model, (x,)).transform(etfuse.passes.default_passes())
    assert op_names(by_transform.exported_program().graph_module) == ["etfuse.conv2d_bn_act.default"] * 2
    torch.testing.assert_close(run(by_transform.to_executorch(), (x,))[0], want, **TOL)
    by_config = edge_program(model, (x,)).to_executorch(
        ExecutorchBackendConfig(passes=etfuse.passes.default_passes()))
    torch.testing.assert_close(run(by_config, (x,))[0], want, **TOL)


class Broadcast(nn.Module):
    """relu(conv(x) + shift), shift one value per channel: a broadcast add, not a residual."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.shift = nn.Parameter(torch.randn(1, 8, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x) + self.shift)


class ConvReadTwice(nn.Module):
    """relu(conv(x) + x), the conv's output also returned: the add cannot go into the conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y + x), y


def test_a_broadcast_add_is_declined_with_its_reason():
    model = Broadcast().eval()
    x = torch.randn(1, 4, 6, 6)
    edge = edge_program(model, (x,))
    p = FusionPass()
    out = fuse(edge, [p])
    assert op_names(out.exported_program().graph_module) == ["etfuse.conv2d_act.default", "etfuse.add_relu.default"]
    reasons = [d.reason for d in p.report.declined if d.rule == "conv2d_residual_relu"]
    assert reasons == ["residual (1, 8, 1, 1) is not the conv's output shape (1, 8, 6, 6): the epilogue "
                       "adds one residual value per output element"]
    torch.testing.assert_close(run(out.to_executorch(), (x,))[0], model(x), **TOL)


def test_a_conv_output_read_elsewhere_keeps_its_add():
    model = ConvReadTwice().eval()
    x = torch.randn(1, 4, 6, 6)
    out = fuse(edge_program(model, (x,)), [FusionPass()])
    assert op_names(out.exported_program().graph_module) == ["etfuse.conv2d_act.default", "etfuse.add_relu.default"]
    for got, want in zip(run(out.to_executorch(), (x,)), model(x)):
        torch.testing.assert_close(got, want, **TOL)
