"""patterns/linear_rank_rules.py: a linear on rank >= 3 (`view -> mm / addmm -> view` in the edge
dialect) as one etfuse::linear_act on the input as it is, the activation after it (relu, SiLU,
GELU, ...) as its epilogue: exact ops, eager / runtime / retrace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import etfuse
from etfuse.passes import FusionPass, default_passes
from fusion_helpers import edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-5)


class GatedMLP(torch.nn.Module):  # llama's FeedForward: w2(silu(w1(x)) * w3(x))
    def __init__(self, dim=16, hidden=24):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=True)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def test_gated_mlp_on_3d_input(fused_matches_eager):
    model, args = GatedMLP().eval(), (torch.randn(2, 5, 16),)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    # 10 rows: each linear_act then reads its weight packed at fuse time (PrepackWeightsPass); the
    # gate's two linears are one over both weights (GatedLinearsPass)
    assert op_names(out.exported_program().graph_module) == ["etfuse.linear_packed_act.default"] * 2
    fusion = next(p for p in passes if type(p) is FusionPass)
    assert sorted(f.rule for f in fusion.report.fused) == ["linear_nd", "linear_nd_no_bias", "linear_nd_no_bias_silu"]
    acts = [n.args[6] for n in out.exported_program().graph.nodes if "linear_packed_act" in str(n.target)]
    assert sorted(acts) == ["none", "swiglu"]
    fused_matches_eager(model, args, out, **TOL)


def test_reshape_that_does_not_restore_the_leading_dims_keeps_its_views():
    class Regroup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 6)

        def forward(self, x):  # [2, 3, 8] -> [6, 8] -> [6, 6] -> [3, 2, 6]: not x's leading dims
            return (x.reshape(6, 8) @ self.fc.weight.t()).reshape(3, 2, 6)

    model, args = Regroup().eval(), (torch.randn(2, 3, 8),)
    out = etfuse.fuse(edge_program(model, args))
    ops = op_names(out.exported_program().graph_module)
    assert ops.count("aten.view_copy.default") == 2
    torch.testing.assert_close(out.exported_program().module()(*args), model(*args), **TOL)


class Mlp(torch.nn.Module):  # ViT's / timm's MLP: fc1 -> act -> fc2 on [B, tokens, dim]
    def __init__(self, act, bias=True, dim=16, hidden=24):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden, bias=bias)
        self.act = act
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


# module, the rule's activation suffix, linear_act's (min, activation)
EPILOGUES = [
    (torch.nn.ReLU(), "relu", (0.0, "none")),
    (torch.nn.GELU(), "gelu", (None, "gelu")),
    (torch.nn.GELU(approximate="tanh"), "gelu_tanh", (None, "gelu_tanh")),
    (torch.nn.SiLU(), "silu", (None, "silu")),
    (torch.nn.Sigmoid(), "sigmoid", (None, "sigmoid")),
    (torch.nn.Hardswish(), "hardswish", (None, "hardswish")),
    (torch.nn.Hardsigmoid(), "hardsigmoid", (None, "hardsigmoid")),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("act, suffix, epilogue", EPILOGUES, ids=[e[1] for e in EPILOGUES])
def test_activation_after_the_view_is_the_epilogue(fused_matches_eager, act, suffix, epilogue, bias):
    model, args = Mlp(act, bias).eval(), (torch.randn(2, 5, 16) * 3,)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    # linear_act, then its packed form (PrepackWeightsPass): input, packed weight, out_features, bias, min, max, act
    assert op_names(out.exported_program().graph_module) == ["etfuse.linear_packed_act.default"] * 2
    fusion = next(p for p in passes if type(p) is FusionPass)
    first = "linear_nd" + ("" if bias else "_no_bias") + f"_{suffix}"
    assert sorted(f.rule for f in fusion.report.fused) == sorted([first, "linear_nd"])
    fc1 = next(n for n in out.exported_program().graph.nodes if "linear_packed_act" in str(n.target))
    assert (fc1.args[4], fc1.args[6]) == epilogue and fc1.args[5] is None
    fused_matches_eager(model, args, out, **TOL)


def test_activation_whose_input_is_also_read_stays_apart(fused_matches_eager):
    class Both(torch.nn.Module):  # the linear's output is needed as it is: not an epilogue
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, x):
            y = self.fc(x)
            return F.gelu(y) + y

    model, args = Both().eval(), (torch.randn(2, 5, 16),)
    out = etfuse.fuse(edge_program(model, args))
    assert op_names(out.exported_program().graph_module) == ["etfuse.linear_packed_act.default",
                                                              "aten.gelu.default", "aten.add.Tensor"]
    fused_matches_eager(model, args, out, **TOL)
