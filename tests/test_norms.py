"""etfuse::rms_norm and etfuse::layer_norm (backend_ops/norm_ops.py, kernels/csrc/ops/rms_norm.cpp
and layer_norm.cpp, patterns/norm_rules.py): the kernels against their patterns, and the rules on
llama's and transformers' hand-written RMSNorm and on nn.LayerNorm / F.layer_norm (exact ops;
eager, runtime and retrace equal to eager)."""

from __future__ import annotations

import pytest
import torch

import etfuse
from etfuse.passes import FusionPass, default_passes
from etfuse.backend_ops import LAYER_NORM, RMS_NORM
from fusion_helpers import edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-5)


pytestmark = pytest.mark.usefixtures("eager_kernels")


def rms_out(x, weight, eps):
    return torch.ops.etfuse.rms_norm.out(x, weight, eps, out=torch.empty(0))


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 37), (2, 288), (1, 1, 1000)], ids=str)
def test_kernel_matches_its_pattern(shape, kernel_isa):
    x, w = torch.randn(shape) * 3, torch.randn(shape[-1])
    got = [rms_out(x, w, 1e-5), rms_out(x, None, 1e-6)]
    if len(shape) > 1:  # rows read through a transposed view
        xt = x.transpose(0, -2).contiguous().transpose(0, -2)
        got.append(rms_out(xt, w, 1e-5))
    torch.testing.assert_close(got[0], RMS_NORM.pattern(x, w, 1e-5), **TOL)
    torch.testing.assert_close(got[1], RMS_NORM.pattern(x, None, 1e-6), **TOL)
    for g in got[2:]:
        torch.testing.assert_close(g, RMS_NORM.pattern(x, w, 1e-5), **TOL)


def test_bad_weight_is_named_and_opcheck(opcheck):
    with pytest.raises(RuntimeError, match=r"etfuse::rms_norm.out: weight \[5\] must be \[8\], the input's last dim"):
        rms_out(torch.randn(2, 8), torch.randn(5), 1e-5)
    for args in ((torch.randn(2, 3, 8), torch.randn(8), 1e-5), (torch.randn(4, 6), None, 0.1)):
        opcheck(RMS_NORM.aten, args)


class LlamaRMSNorm(torch.nn.Module):  # executorch.examples.models.llama.norm.RMSNorm
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


class HfRMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class UnscaledRMSNorm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-3)


@pytest.mark.parametrize("norm, rule", [(LlamaRMSNorm, "rms_norm"), (HfRMSNorm, "rms_norm_pow"),
                                        (UnscaledRMSNorm, "rms_norm_no_weight")],
                         ids=lambda v: getattr(v, "__name__", v))
def test_hand_written_rms_norms_become_one_op(fused_matches_eager, norm, rule):
    x = torch.randn(2, 5, 16)
    model = norm(16) if norm is not UnscaledRMSNorm else norm()
    edge = edge_program(model.eval(), (x,))
    passes = default_passes()
    out = etfuse.fuse(edge, passes)
    assert op_names(out.exported_program().graph_module) == ["etfuse.rms_norm.default"]
    fusion = next(p for p in passes if type(p) is FusionPass)
    assert [f.rule for f in fusion.report.fused] == [rule]
    node = next(n for n in out.exported_program().graph.nodes if "rms_norm" in str(n.target))
    assert round(node.args[2] - (model.eps if hasattr(model, "eps") else 1e-3), 9) == 0
    fused_matches_eager(model, (x,), out, **TOL)


def test_mean_over_another_dim_is_not_rms_norm():
    class Other(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-5)

    out = etfuse.fuse(edge_program(Other(), (torch.randn(2, 5, 16),)))
    assert "etfuse.rms_norm.default" not in op_names(out.exported_program().graph_module)


LN_TOL = dict(rtol=1e-4, atol=5e-5)


def layer_out(x, weight, bias, eps):
    return torch.ops.etfuse.layer_norm.out(x, weight, bias, eps, out=torch.empty(0))


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 37), (37, 768), (1, 1, 1000)], ids=str)
def test_layer_norm_kernel_matches_its_pattern(shape, kernel_isa):
    # an offset large against the spread: a one-pass sum of squares loses the variance by ~5e-4
    # here; x - mean itself rounds at ~1e-5 (x near 100), so the tolerance is LN_TOL
    x, w, b = torch.randn(shape) * 3 + 100, torch.randn(shape[-1]), torch.randn(shape[-1])
    cases = [((x, w, b, 1e-5), layer_out(x, w, b, 1e-5)), ((x, None, None, 1e-6), layer_out(x, None, None, 1e-6)),
             ((x, w, None, 0.1), layer_out(x, w, None, 0.1))]
    if len(shape) > 1:  # rows read through a transposed view, weight through a strided one
        xt = x.transpose(0, -2).contiguous().transpose(0, -2)
        ws = torch.randn(2 * shape[-1])[::2]
        cases.append(((x, ws, b, 1e-5), layer_out(xt, ws, b, 1e-5)))
    for args, got in cases:
        torch.testing.assert_close(got, LAYER_NORM.pattern(*args), **LN_TOL)
        torch.testing.assert_close(got, torch.nn.functional.layer_norm(args[0], args[0].shape[-1:], *args[1:]),
                                   **LN_TOL)


def test_layer_norm_bad_bias_is_named_and_opcheck(opcheck):
    with pytest.raises(RuntimeError, match=r"etfuse::layer_norm.out: bias \[5\] must be \[8\], the input's last dim"):
        layer_out(torch.randn(2, 8), torch.randn(8), torch.randn(5), 1e-5)
    for args in ((torch.randn(2, 3, 8), torch.randn(8), torch.randn(8), 1e-5), (torch.randn(4, 6), None, None, 0.1)):
        opcheck(LAYER_NORM.aten, args)


class LayerNorms(torch.nn.Module):  # affine, weight only, none; and F.layer_norm
    def __init__(self, dim):
        super().__init__()
        self.affine = torch.nn.LayerNorm(dim, eps=1e-6)
        self.no_bias = torch.nn.LayerNorm(dim, bias=False)
        self.plain = torch.nn.LayerNorm(dim, elementwise_affine=False)

    def forward(self, x):
        y = self.plain(self.no_bias(self.affine(x)))
        return torch.nn.functional.layer_norm(torch.relu(y), (y.shape[-1],), eps=1e-3)


def test_layer_norms_over_the_last_dim_become_one_op_each(fused_matches_eager):
    torch.manual_seed(0)
    model, args = LayerNorms(16).eval(), (torch.randn(2, 5, 16) * 4 + 1,)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    assert op_names(out.exported_program().graph_module) == \
        ["etfuse.layer_norm.default"] * 3 + ["aten.relu.default", "etfuse.layer_norm.default"]
    fusion = next(p for p in passes if type(p) is FusionPass)
    assert [f.rule for f in fusion.report.fused] == ["layer_norm"] * 4
    nodes = [n for n in out.exported_program().graph.nodes if "layer_norm" in str(n.target)]
    assert [(n.args[1] is None, n.args[2] is None, n.args[3]) for n in nodes] == \
        [(False, False, 1e-6), (False, True, 1e-5), (True, True, 1e-5), (True, True, 1e-3)]
    fused_matches_eager(model, args, out, **TOL)


class LayerNormTwoDims(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.layer_norm(x, x.shape[-2:])


class LayerNormStats(torch.nn.Module):
    def forward(self, x):
        out, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [16], None, None, 1e-5)
        return out + mean * rstd


@pytest.mark.parametrize("norm", [LayerNormTwoDims, LayerNormStats], ids=lambda c: c.__name__)
def test_layer_norm_over_two_dims_or_with_its_statistics_read_stays_stock(norm):
    model, args = norm(), (torch.randn(2, 5, 16),)
    out = etfuse.fuse(edge_program(model, args))
    ops = op_names(out.exported_program().graph_module)
    assert "aten.native_layer_norm.default" in ops
    assert "etfuse.layer_norm.default" not in ops
    torch.testing.assert_close(out.exported_program().module()(*args), model(*args), **TOL)
