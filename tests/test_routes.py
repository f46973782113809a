"""The three documented routes give the same program and the same numbers, for every pass of
`default_passes()`:

    etfuse.fuse(edge)
    edge.transform(default_passes())
    edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))

Batch norm is fused as the kernel's epilogue (`conv2d_bn_act`, `linear_bn_act`), which needs no
parameter values at fuse time: `to_executorch(passes=...)`, which hands passes only the graph
module, gets the same program as the other two routes.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge
from torch.export import Dim, export

import etfuse
from etfuse.passes import default_passes
from etfuse.runtime import run
from fusion_helpers import card_names, plan_ops, op_names, pt2e_int8 as pt2e_int8_per_channel
from test_gemm_conv import _randomise_bn
from test_quant_fusion import AddModel, calibration, pt2e_int8

TOL = dict(rtol=1e-4, atol=1e-4)


class ConvBnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn = torch.nn.Linear(12, 6), torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x))


class CondAddRelu(torch.nn.Module):
    def forward(self, p, x, y):
        return torch.cond(p.sum() > 0, lambda x, y: torch.relu(x + y), lambda x, y: x - y, (x, y))


class CountedLoop(torch.nn.Module):
    """while i < 6: acc = relu(acc + x * i); the body's add+relu fuses."""

    def forward(self, x):
        def cond(i, acc):
            return i < 6

        def body(i, acc):
            return i + 1, torch.relu(acc + x * i)

        return torch.while_loop(cond, body, (torch.zeros((), dtype=torch.int64), torch.zeros_like(x)))


class SymIntModel(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]
        return torch.relu(x + 1) * (n // 2) + (n % 3)


def _quantized():
    args = (torch.randn(2, 8), torch.randn(2, 8))
    return pt2e_int8(AddModel(), args, calibration((2, 8), (2, 8))), args, None


def _quantized_conv():
    """PT2E int8 conv + relu6 and a linear (etfuse::quantized_conv2d / quantized_linear)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU6(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 5)).eval()
    args = (torch.randn(1, 3, 6, 6),)
    return to_edge(pt2e_int8_per_channel(model, args)), args, None


def _model(model, args, dynamic_shapes=None):
    return to_edge(export(model, args, dynamic_shapes=dynamic_shapes)), args, model


CASES = {
    "conv_bn_relu": lambda: _model(_randomise_bn(ConvBnRelu()), (torch.randn(2, 3, 8, 8),)),
    "linear_bn": lambda: _model(_randomise_bn(LinearBn()), (torch.randn(5, 12),)),
    "quantized_add": _quantized,
    "quantized_conv": _quantized_conv,
    "cond": lambda: _model(CondAddRelu(), (torch.ones(2), torch.randn(4), torch.randn(4))),
    "while_loop": lambda: _model(CountedLoop(), (torch.randn(4),)),
    "symint": lambda: _model(SymIntModel(), (torch.randn(6, 4),), ({0: Dim("n", min=2, max=20)},)),
}


pytestmark = pytest.mark.usefixtures("runtime_kernels")


@pytest.mark.parametrize("case", sorted(CASES))
def test_three_routes_same_program_same_numbers(case):
    edge, args, model = CASES[case]()
    by_fuse = etfuse.fuse(edge)
    by_transform = edge.transform(default_passes())
    fused_names = op_names(by_fuse.exported_program().graph_module)
    if any(n.startswith("quantized_decomposed.") for n in fused_names):
        # transform holds etfuse's twins of the quantized ops already (passes/runtime_names.py)
        assert card_names(op_names(by_transform.exported_program().graph_module)) == fused_names
    else:
        assert by_transform.exported_program().graph_module.code == by_fuse.exported_program().graph_module.code
    fused_ops = [n for n in fused_names if n.startswith(("etfuse.", "quantized_decomposed.add"))]
    assert fused_ops or case in ("while_loop", "cond", "symint"), case  # top-level fused ops exist where expected

    programs = {"fuse": by_fuse.to_executorch(), "transform": by_transform.to_executorch(),
                "to_executorch(passes=...)": edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))}
    # the same kernels in both .pte (the config route packs no weights: it has no values)
    assert plan_ops(programs["transform"]) == plan_ops(programs["fuse"])
    outputs = {route: run(program, args) for route, program in programs.items()}
    want = outputs["fuse"] if model is None else list(pytree_leaves(model(*args)))
    for route, got in outputs.items():
        assert len(got) == len(want), route
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL, msg=lambda m: f"{case} via {route}: {m}")


def pytree_leaves(out):
    return torch.utils._pytree.tree_leaves(out)


def test_every_route_runs_batch_norm_in_the_conv_kernel():
    edge, args, model = CASES["conv_bn_relu"]()
    assert op_names(etfuse.fuse(edge).exported_program().graph_module) == ["etfuse.conv2d_bn_act.default"]
    assert op_names(edge.transform(default_passes()).exported_program().graph_module) == ["etfuse.conv2d_bn_act.default"]
    # to_executorch(passes=...) hands passes the graph module only: the same one op runs, no per-call fold
    et = edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    ops = [o.name for o in et.executorch_program.execution_plan[0].operators]
    assert ops == ["etfuse::conv2d_bn_act"], ops
