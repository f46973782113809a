"""A linear's residual add (`r + linear(h)`, a transformer's skip connection) as `linear_act`'s
residual epilogue: the kernels against the pattern, the exact fused ops, the three routes, eager /
runtime / retrace, and the adds that must stay apart."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import ExecutorchBackendConfig, to_edge

import etfuse
from etfuse.backend_ops import LINEAR_ACT, LINEAR_PACKED_ACT, PACK_GEMM_WEIGHT
from etfuse.passes import FusionPass, default_passes
from etfuse.runtime import run
from fusion_helpers import assert_fused_matches_eager, edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-5)


pytestmark = pytest.mark.usefixtures("eager_kernels")


CASES = [  # input shape, out_features, bias, min, max, activation
    ((1, 8), 5, True, None, None, "none"),          # one row: the dot-product path (unpacked)
    ((3, 40), 17, False, 0.0, None, "none"),        # relu
    ((5, 600), 50, True, None, None, "none"),       # 3 K slices, a partial last panel
    ((2, 19, 300), 64, True, -0.5, 0.5, "gelu"),    # rank 3, 2 K slices, clamp then GELU
    ((37, 64), 48, False, None, None, "silu"),
]


@pytest.mark.parametrize("kernel_isa", ["baseline", "avx2", "auto"], indirect=True)
def test_kernels_match_the_pattern(kernel_isa):
    g = torch.Generator().manual_seed(0)
    for shape, n, with_bias, lo, hi, act in CASES:
        x = torch.randn(shape, generator=g)
        w, b = torch.randn(n, shape[-1], generator=g), torch.randn(n, generator=g) if with_bias else None
        r = torch.randn(*shape[:-1], n, generator=g) * 4
        want = LINEAR_ACT.pattern(x, w, b, lo, hi, act, r)
        eager = F.linear(x, w, b) + r
        eager = {"none": lambda y: y, "gelu": F.gelu, "silu": F.silu}[act](
            eager if lo is None and hi is None else eager.clamp(lo, hi))
        torch.testing.assert_close(want, eager)  # the pattern is what it says
        got = LINEAR_ACT.aten_out(x, w, b, lo, hi, act, r, out=torch.empty(0))
        torch.testing.assert_close(got, want, **TOL)
        packed = PACK_GEMM_WEIGHT.aten(w)
        got = LINEAR_PACKED_ACT.aten_out(x, packed, n, b, lo, hi, act, r, out=torch.empty(0))
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(LINEAR_PACKED_ACT.pattern(x, packed, n, b, lo, hi, act, r), want, **TOL)


def test_residual_and_out_through_strides():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(6, 40, generator=g), torch.randn(20, 40, generator=g), torch.randn(20, generator=g)
    r = torch.randn(20, 6, generator=g).t()  # a transposed view
    want = F.linear(x, w, b) + r
    torch.testing.assert_close(LINEAR_ACT.aten_out(x, w, b, None, None, "none", r, out=torch.empty(0)), want, **TOL)
    out = torch.empty(20, 6).t()  # out strided along its rows: the epilogue through the tile buffer
    LINEAR_PACKED_ACT.aten_out(x, PACK_GEMM_WEIGHT.aten(w), 20, b, None, None, "none", r, out=out)
    torch.testing.assert_close(out, want, **TOL)
    x3, r3 = torch.randn(2, 3, 40, generator=g), torch.randn(3, 2, 20, generator=g).transpose(0, 1)
    want3 = F.linear(x3, w, b) + r3  # r3's leading dims do not merge into one: read through a copy
    torch.testing.assert_close(LINEAR_ACT.aten_out(x3, w, b, None, None, "none", r3, out=torch.empty(0)), want3, **TOL)
    both = torch.randn(6, 20, generator=g)  # out is the residual itself: read before it is written
    want = F.linear(x, w, b) + both
    LINEAR_ACT.aten_out(x, w, b, None, None, "none", both, out=both)
    torch.testing.assert_close(both, want, **TOL)


def test_a_residual_of_another_shape_is_an_error_that_names_it():
    x, w = torch.randn(4, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match=r"etfuse::linear_act.out: residual must have the output's shape "
                                           r"\[4, 5\], got \[5\]"):
        LINEAR_ACT.aten_out(x, w, None, None, None, "none", torch.randn(5), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_packed_act.out: residual must be float32"):
        LINEAR_PACKED_ACT.aten_out(x, PACK_GEMM_WEIGHT.aten(w), 5, None, None, None, "none",
                                   torch.ones(4, 5, dtype=torch.int32), out=torch.empty(0))


def test_ops_pass_opcheck():
    x, w, b, r = torch.randn(3, 2, 8), torch.randn(5, 8), torch.randn(5), torch.randn(3, 2, 5)
    for op, args in ((LINEAR_ACT, (x, w, b, None, None, "none", r)),
                     (LINEAR_PACKED_ACT, (x, PACK_GEMM_WEIGHT.aten(w), 5, b, 0.0, None, "gelu", r))):
        torch.library.opcheck(op.aten, args)
        # out variants: aot_dispatch cannot functionalize `Tensor(a!)` returns (as for every `.out` op)
        torch.library.opcheck(op.aten_out, args, {"out": torch.empty(3, 2, 5)},
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


class Block(torch.nn.Module):  # a pre-norm transformer block's two skip connections
    def __init__(self, dim=16, hidden=32, bias=True):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = torch.nn.Linear(dim, dim, bias=bias)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        x = x + self.proj(self.norm(x))
        return self.fc2(F.gelu(self.fc1(x))) + x  # the residual on either side of the add


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", [(2, 5, 16), (6, 16)], ids=["rank3", "rank2"])
def test_transformer_block_fuses_its_skip_connections(shape, bias):
    torch.manual_seed(0)
    model, args = Block(bias=bias).eval(), (torch.randn(shape),)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    graph = out.exported_program().graph
    assert op_names(out.exported_program().graph_module) == [
        "etfuse.layer_norm.default", "etfuse.linear_packed_act.default", "etfuse.linear_packed_act.default",
        "etfuse.linear_packed_act.default"]
    fusion = next(p for p in passes if type(p) is FusionPass)
    nd = "_nd" if len(shape) == 3 else ""
    residual = f"linear{nd}" + ("" if bias else "_no_bias") + "_residual"
    assert sorted(f.rule for f in fusion.report.fused if "residual" in f.rule) == [residual, residual]
    # input, packed weight, out_features, bias, min, max, activation, residual
    proj, fc1, fc2 = [n for n in graph.nodes if "linear_packed_act" in str(n.target)]
    assert proj.args[7].op == "placeholder" and len(fc1.args) == 7 and fc2.args[7] is proj
    assert fc1.args[6] == "gelu"
    assert_fused_matches_eager(model, args, out, **TOL)


def test_relu_after_the_residual_add_is_the_epilogue():
    class ResidualRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(24, 24)

        def forward(self, x):
            return torch.relu(x + self.fc(x))

    model, args = ResidualRelu().eval(), (torch.randn(2, 3, 24),)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    (node,) = [n for n in out.exported_program().graph.nodes if n.op == "call_function"]
    assert "linear_packed_act" in str(node.target) and node.args[4] == 0.0 and node.args[5] is None
    fusion = next(p for p in passes if type(p) is FusionPass)
    assert [f.rule for f in fusion.report.fused] == ["linear_nd_residual_relu"]
    assert_fused_matches_eager(model, args, out, **TOL)


def test_adds_that_are_not_a_residual_stay_apart():
    class NotResidual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 6)
            self.shift = torch.nn.Parameter(torch.randn(6))
            self.scale = torch.nn.Parameter(torch.randn(2, 6))

        def forward(self, x):
            y = self.fc(x)
            doubled = y + y                      # the "residual" is the linear itself
            shifted = self.fc(x * 2) + self.shift  # broadcast [6]: a bias, not a residual
            scaled = torch.add(self.fc(x - 1), self.scale, alpha=2.0)  # alpha 2
            return doubled, shifted, scaled

    model, args = NotResidual().eval(), (torch.randn(2, 8),)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    fusion = next(p for p in passes if type(p) is FusionPass)
    assert not [f.rule for f in fusion.report.fused if "residual" in f.rule]
    assert [n for n in op_names(out.exported_program().graph_module) if "add" in n] == [
        "aten.add.Tensor", "etfuse.add.default", "aten.add.Tensor"]
    want = model(*args)
    for got, expected in zip(out.exported_program().module()(*args), want):
        torch.testing.assert_close(got, expected, **TOL)
    for got, expected in zip(run(out.to_executorch(), args), want):
        torch.testing.assert_close(got, expected, **TOL)


def test_transform_and_the_backend_config_route():
    torch.manual_seed(0)
    model, args = Block().eval(), (torch.randn(2, 5, 16),)
    edge = to_edge(torch.export.export(model, args))
    transformed = edge.transform(default_passes())
    program = copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    # no values on this route, so no packing: linear_act keeps its residual
    names = [o.name for o in program.executorch_program.execution_plan[0].operators]
    assert "etfuse::linear_act" in names and "aten::add" not in names
    assert op_names(transformed.exported_program().graph_module).count("etfuse.linear_packed_act.default") == 3
    want = model(*args)
    for outs in (run(program, args), run(transformed.to_executorch(), args)):
        torch.testing.assert_close(outs[0], want, **TOL)
