"""Gated linears (SwiGLU / GeGLU): linear_act, linear_packed_act and linear_qw with a gated
activation against their patterns on every path (decode dot products, blocks, the GEMM) and ISA,
opcheck, named errors; `GatedLinearsPass` joining a gated MLP's two linears through `fuse` (exact
ops; eager, retrace and runtime equal to eager), and what it leaves alone."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import ExecutorchBackendConfig
from torchao.quantization.granularity import PerGroup
from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_

import etfuse
from etfuse.backend_ops import LINEAR_ACT, LINEAR_PACKED_ACT, LINEAR_QW, PACK_GEMM_WEIGHT, PACK_INT4
from etfuse.passes import GatedLinearsPass, default_passes
from fusion_helpers import assert_fused_matches_eager, edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-5)
INNER = {"swiglu": F.silu, "geglu": F.gelu, "geglu_tanh": lambda v: F.gelu(v, approximate="tanh")}


pytestmark = pytest.mark.usefixtures("eager_kernels")


def gated(y, activation):
    a, b = y.chunk(2, -1)
    return INNER[activation](a) * b


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("rows", [1, 5, 70])  # linear_qw: dot products, dequantized blocks, the GEMM
def test_kernels_match_their_patterns(rows, kernel_isa):
    g = torch.Generator().manual_seed(rows)
    k, h = 64, 24
    x = torch.randn(rows, k, generator=g) if rows % 2 else torch.randn(2, rows // 2, k, generator=g)
    w, b = torch.randn(2 * h, k, generator=g), torch.randn(2 * h, generator=g)
    r = torch.randn(*x.shape[:-1], 2 * h, generator=g)  # the residual has all 2h features
    q = torch.randint(-8, 8, (2 * h, k), dtype=torch.int8, generator=g)
    scales = torch.rand(2 * h, 2, generator=g) * 0.1 + 0.01
    packed_q4 = PACK_INT4.aten(q)
    calls = {
        "linear_act": (LINEAR_ACT, lambda act, res: (x, w, b, -3.0, 3.0, act, res)),
        "linear_packed_act": (LINEAR_PACKED_ACT, lambda act, res: (x, PACK_GEMM_WEIGHT.aten(w), 2 * h, b, None, None,
                                                                     act, res)),
        "linear_qw int4": (LINEAR_QW, lambda act, res: (x, packed_q4, scales, None, 4, b, act, res)),
        "linear_qw int8": (LINEAR_QW, lambda act, res: (x, q, scales, None, 8, None, act, res)),
    }
    got = {(name, act, res is not None): op.aten_out(*make(act, res), out=torch.empty(0))
           for name, (op, make) in calls.items() for act in INNER for res in (None, r)}
    for (name, act, with_res), out in got.items():
        op, make = calls[name]
        args = make(act, r if with_res else None)
        assert out.shape == (*x.shape[:-1], h)
        torch.testing.assert_close(out, op.pattern(*args), **TOL)
        # the pattern is the plain linear's output, gated
        plain = op.pattern(*make("none", r if with_res else None))
        torch.testing.assert_close(op.pattern(*args), gated(plain, act), rtol=1e-6, atol=1e-6)


def test_opcheck_and_named_errors():
    x, w, b = torch.randn(3, 2, 16), torch.randn(10, 16), torch.randn(10)
    q = torch.randint(-8, 8, (10, 32), dtype=torch.int8)
    for op, args in ((LINEAR_ACT, (x, w, b, None, None, "swiglu")),
                     (LINEAR_PACKED_ACT, (x, PACK_GEMM_WEIGHT.aten(w), 10, b, 0.0, None, "geglu", torch.randn(3, 2, 10))),
                     (LINEAR_QW, (torch.randn(3, 32), PACK_INT4.aten(q), torch.ones(10, 1), None, 4, None, "geglu_tanh"))):
        torch.library.opcheck(op.aten, args)
        out = torch.empty(*args[0].shape[:-1], 5)
        torch.library.opcheck(op.aten_out, args, {"out": out},
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_act.out: a gated activation needs an even number of "
                                           r"output features, got 9"):
        LINEAR_ACT.aten_out(x, w[:9], None, None, None, "swiglu", out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_qw.out: a gated activation needs an even number"):
        LINEAR_QW.aten_out(torch.randn(3, 32), q[:9], torch.ones(9, 1), None, 8, None, "swiglu", out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_act.out: unknown activation 'reglu' \(none, .*gated: "
                                           r"swiglu, geglu, geglu_tanh\)"):
        LINEAR_ACT.aten_out(x, w, None, None, None, "reglu", out=torch.empty(0))
    with pytest.raises(ValueError, match=r"the gated activation 'swiglu' needs an even number of output features, "
                                         r"got 9"):
        LINEAR_ACT.pattern(x, w[:9], None, None, None, "swiglu")


class SwiGluMlp(torch.nn.Module):
    """llama's FeedForward: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, bias=False, act=F.silu):
        super().__init__()
        self.w1, self.w3 = torch.nn.Linear(64, 96, bias=bias), torch.nn.Linear(64, 96, bias=bias)
        self.w2, self.act = torch.nn.Linear(96, 64, bias=bias), act

    def forward(self, x):
        return self.w2(self.act(self.w1(x)) * self.w3(x))


def _gated_linear(ep):
    return next(n for n in ep.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("bits,shape,bias,activation", [
    (None, (1, 1, 64), False, "swiglu"),   # a decoding step
    (None, (2, 7, 64), True, "swiglu"),    # prefill: the joined weight is packed for the GEMM
    (None, (5, 64), True, "geglu"),
    (4, (1, 1, 64), False, "swiglu"),
    (8, (3, 64), True, "swiglu"),
], ids=str)
def test_fuse_joins_the_two_linears_of_a_gated_mlp(bits, shape, bias, activation):
    torch.manual_seed(0)
    model = SwiGluMlp(bias, F.silu if activation == "swiglu" else F.gelu).eval()
    if bits:
        quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=PerGroup(32)))
    x = torch.randn(shape)
    fused = etfuse.fuse(edge_program(model, (x,)))
    ep = fused.exported_program()
    linear = ("etfuse.linear_qw.default" if bits else
              "etfuse.linear_packed_act.default" if x.numel() // 64 >= 3 else "etfuse.linear_act.default")
    assert op_names(ep.graph_module) == [linear] * 2
    joined = _gated_linear(ep)
    assert activation in joined.args and joined.args[1].op == "placeholder"  # one joined constant
    rows = joined.args[2] if linear.startswith("etfuse.linear_packed") else joined.args[1].meta["val"].shape[0]
    assert rows == 2 * 96
    assert_fused_matches_eager(model, (x,), fused, **TOL)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = torch.nn.Linear(64, 96), torch.nn.Linear(64, 96)

    def forward(self, x, y):
        gate = F.silu(self.w1(x))
        return gate * self.w3(y) - gate  # different inputs; the gate is read twice


def test_linears_of_different_inputs_or_read_elsewhere_stay_apart():
    model, args = TwoInputs().eval(), (torch.randn(1, 64), torch.randn(1, 64))
    fused = etfuse.fuse(edge_program(model, args))
    assert op_names(fused.exported_program().graph_module) == ["etfuse.linear_act.default", "etfuse.linear_act.default",
                                                              "aten.mul.Tensor", "aten.sub.Tensor"]
    assert_fused_matches_eager(model, args, fused, **TOL)


def test_graph_module_route_keeps_the_two_linears():
    """ExecutorchBackendConfig(passes=...) hands passes a graph module: no weight values to join."""
    model, x = SwiGluMlp().eval(), torch.randn(1, 64)
    result = GatedLinearsPass()(copy.deepcopy(edge_program(model, (x,)).exported_program().graph_module))
    assert "aten.mul.Tensor" in op_names(result.graph_module)
    program = edge_program(model, (x,)).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    assert sum("linear_act" in n for n in op_names(program.exported_program().graph_module)) == 3
