"""Dynamically quantized linears (etfuse::linear_dq, torchao's 8da4w / 8da8w): the kernel against
its pattern and against exact integer sums (every ISA, 1 to 70 rows, int4 groups and int8 per
channel, zero points, bias, residual, SiLU, SwiGLU), named errors, opcheck; torchao
`Int8DynamicActivationIntxWeightConfig` models fused (the exact ops before and after; fused and
retraced programs equal to eager; the .pte on the runtime within float32 rounding of the scales);
an 8da4w llama decoding 32 tokens greedily as eager does."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir.passes.constant_prop_pass import get_constant_placeholder_dict
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, MappingType, quantize_
from torchao.quantization.granularity import PerAxis, PerGroup

import etfuse
from etfuse.backend_ops import LINEAR_DQ, WEIGHT_ROW_SUMS
from etfuse.runtime import load_method, run
from fusion_helpers import (ResidualMlp, assert_greedy_decoding_matches_eager, edge_program, example_llama, op_names,
                            quantized_weight, weight_row_sums)

pytestmark = pytest.mark.usefixtures("eager_kernels")


def dq_args(x, w, scales, zp, bits, *rest):
    """linear_dq's arguments from linear_qw's: the weight's row sums after the weight."""
    return (x, w, weight_row_sums(w, scales, zp, bits), scales, zp, bits, *rest)


def linear_dq(*args):
    return torch.ops.etfuse.linear_dq.out(*dq_args(*args), out=torch.empty(0))


def dq_pattern(*args):
    return LINEAR_DQ.pattern(*dq_args(*args))


def full_range_weight(n, k, group, bits, zero_points):
    """fusion_helpers.quantized_weight with zero points anywhere in the weight's range (torchao's
    asymmetric weights)."""
    return quantized_weight(n, k, group, bits, zero_points, zp_range=(-8, 7) if bits == 4 else (-128, 127))


def exact_sums(x, q, scales, zp, group, bias):
    """s_x * sum_g s_w * D, D the integer sums over each group (int64), in float64: what the kernel
    computes before its float32 rounding."""
    n, k = q.shape
    rows = x.reshape(-1, k)
    lo, hi = rows.amin(-1, keepdim=True).clamp(max=0), rows.amax(-1, keepdim=True).clamp(min=0)
    s = ((hi - lo) / 255.0).clamp(min=torch.finfo(torch.float32).smallest_normal)
    zx = (-128 - torch.round(lo / s)).clamp(-128, 127)
    xq = ((torch.round(rows * s.reciprocal()) + zx).clamp(-128, 127) - zx).long()
    w = q.long() - (zp.long().repeat_interleave(group, 1) if zp is not None else 0)
    d = torch.einsum("mgk,ngk->mng", xq.reshape(-1, k // group, group), w.reshape(n, k // group, group))
    out = s.double() * (d.double() * scales.double()).sum(-1) + (bias.double() if bias is not None else 0)
    return out.reshape(*x.shape[:-1], n)


# rows: 1 (decode), 5 and 70 (prefill); K with and without a tail past 16 columns (int8 per channel);
# 70 x 1024 quantizes its rows in parallel tasks
@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("rows,n,k,group,bits,zero_points,bias", [
    (1, 37, 64, 32, 4, False, True), (5, 40, 96, 96, 8, True, False), (1, 11, 160, 32, 4, True, False),
    (2, 9, 256, 128, 4, True, True), (4, 6, 200, 200, 8, False, True), (9, 13, 72, 36, 8, True, True),
    (70, 20, 64, 64, 4, True, True), (70, 11, 70, 70, 8, False, False), (70, 8, 1024, 128, 4, True, False),
], ids=str)
def test_kernel_matches_exact_integer_sums_and_its_pattern(rows, n, k, group, bits, zero_points, bias, kernel_isa):
    q, w, scales, zp = full_range_weight(n, k, group, bits, zero_points)
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    b = torch.randn(n, generator=gen) if bias else None
    x = torch.randn(rows, k, generator=gen) if rows % 2 else torch.randn(2, rows // 2, k, generator=gen)
    x[..., 0] += 3.0  # rows whose zero point is not -128 + 0
    r = torch.randn(*x.shape[:-1], n, generator=gen)
    got = {act: linear_dq(x, w, scales, zp, bits, b, act) for act in ("none", "silu")}
    got["residual"] = linear_dq(x, w, scales, zp, bits, b, "silu", r)
    got["strided"] = linear_dq(x.transpose(0, -1).contiguous().transpose(0, -1), w, scales, zp, bits, b, "none")
    # the integer sums exact: only the scales' float32 products (and the bias add) round
    want = exact_sums(x, q, scales, zp, group, b)
    torch.testing.assert_close(got["none"].double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    torch.testing.assert_close(got["strided"], got["none"], rtol=0, atol=0)
    # the pattern rounds each dequantized element and sums in float32: K ulps of sum |x| |w|
    pattern = {act: dq_pattern(x, w, scales, zp, bits, b, act) for act in ("none", "silu")}
    pattern["residual"] = dq_pattern(x, w, scales, zp, bits, b, "silu", r)
    tol = dict(rtol=1e-4, atol=k * 2.0 ** -24 * float(x.abs().max() * 2 * scales.max() * 256 * k))
    for key in pattern:
        torch.testing.assert_close(got[key], pattern[key], **tol)


def test_swiglu_epilogue_halves_the_features():
    q, w, scales, _ = full_range_weight(16, 64, 32, 4, False)
    x = torch.randn(3, 64)
    got = linear_dq(x, w, scales, None, 4, None, "swiglu")
    full = linear_dq(x, w, scales, None, 4, None, "none")
    torch.testing.assert_close(got, torch.nn.functional.silu(full[:, :8]) * full[:, 8:], rtol=1e-5, atol=1e-6)


def rows_at_rounding_ties():
    """Rows of scale s = 2.55 / 255 (min -1, max 1.55) whose other values lie within 3 ulps of
    (k + 1/2) s: where torchao's round(x * (1 / s)), half to even, differs from round(x / s) or
    from rounding half away from zero."""
    s = torch.tensor(2.55) / 255
    v = ((torch.arange(-100, 154, dtype=torch.float32) + 0.5) * s).view(torch.int32)
    v = torch.cat([(v + d).view(torch.float32) for d in range(-3, 4)])
    v = v[v.abs() < 0.999]
    v = v[:len(v) // 126 * 126].reshape(-1, 126)
    ends = torch.tensor([-1.0, 1.55]).expand(len(v), 2)
    return torch.cat([ends, v], 1)


def torchao_per_token(x):
    from torchao.quantization.quant_primitives import choose_qparams_affine, dequantize_affine, quantize_affine

    block = [1] * (x.dim() - 1) + [x.shape[-1]]
    s, zp = choose_qparams_affine(x, MappingType.ASYMMETRIC, block, torch.int8, -128, 127, None, None, torch.int8)
    return dequantize_affine(quantize_affine(x, block, s, zp, torch.int8, -128, 127), block, s, zp, torch.int8, -128, 127)


def test_rows_are_quantized_as_torchao_does():
    """The pattern's per-token quantization is torchao's choose_qparams -> quantize -> dequantize,
    bit for bit (constant rows, rows all positive, all negative, tiny and large; rounding ties)."""
    from etfuse.backend_ops.dynamic_quant_ops import _quantize_per_token

    x = torch.randn(6, 2, 100) * torch.tensor([1e-30, 1e-3, 1.0, 50.0, 1.0, 1.0]).reshape(6, 1, 1)
    x[4] = x[4].abs() + 1
    x[5] = -x[5].abs()
    x[0, 0] = 0.0
    torch.testing.assert_close(_quantize_per_token(x), torchao_per_token(x), rtol=0, atol=0)
    ties = rows_at_rounding_ties()
    inv = (torch.tensor(2.55) / 255).reciprocal()
    assert (torch.round(ties * inv) != torch.round(ties / (torch.tensor(2.55) / 255))).any()  # the rows still probe it
    torch.testing.assert_close(_quantize_per_token(ties), torchao_per_token(ties), rtol=0, atol=0)


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
def test_kernel_quantizes_rounding_ties_as_torchao(kernel_isa):
    """Read back through an identity weight (int8, scale 1), the kernel's quantized rows are
    torchao's dequantized ones exactly: s * (qx - zx), one product each."""
    x = rows_at_rounding_ties()
    k = x.shape[1]
    got = linear_dq(x, torch.eye(k, dtype=torch.int8), torch.ones(k, 1), None, 8, None, "none")
    torch.testing.assert_close(got, torchao_per_token(x), rtol=0, atol=0)


def test_bad_arguments_are_named_and_opcheck():
    q, w, scales, _ = full_range_weight(8, 64, 32, 4, False)
    with pytest.raises(RuntimeError, match=r"etfuse::linear_dq.out: bits must be 8 or 4, got 5"):
        linear_dq(torch.randn(2, 64), w, scales, None, 5, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::linear_dq.out: weight \[8, 32\] does not hold 48 input features"):
        linear_dq(torch.randn(2, 48), w, scales, None, 4, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::linear_dq.out: 4-bit groups of 16 columns"):
        linear_dq(torch.randn(2, 64), w, torch.ones(8, 4), None, 4, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::linear_dq.out: weight_row_sums \[8, 1\] must be \[N\] for the scales"):
        torch.ops.etfuse.linear_dq.out(torch.randn(2, 64), w, torch.zeros(8, 1), scales, None, 4, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_dq.out: weight_row_sums must be Float, got Int"):
        torch.ops.etfuse.linear_dq.out(torch.randn(2, 64), w, torch.zeros(8, dtype=torch.int32), scales, None, 4,
                                       out=torch.empty(0))
    for args in ((torch.randn(3, 64), w, scales, None, 4, torch.randn(8), "silu"),
                 (torch.randn(2, 2, 64), q, scales, torch.ones(8, 2, dtype=torch.int8), 8, None, "none"),
                 (torch.randn(2, 2, 64), w, scales, None, 4, None, "none", torch.randn(2, 2, 8))):
        torch.library.opcheck(LINEAR_DQ.aten, dq_args(*args))


def test_weight_row_sums_kernel_matches_its_pattern():
    for groups, zero_points in ((1, False), (3, True), (32, True), (96, False)):
        q, _, scales, zp = full_range_weight(7, 96, 96 // groups, 8, zero_points)
        got = torch.ops.etfuse.weight_row_sums.out(q, scales, zp, out=torch.empty(0))
        want = weight_row_sums(q, scales, zp, 8)
        torch.testing.assert_close(got, want, rtol=1e-7, atol=0)
        torch.testing.assert_close(WEIGHT_ROW_SUMS.pattern(q, scales, zp), want, rtol=1e-7, atol=0)
    with pytest.raises(RuntimeError, match=r"etfuse::weight_row_sums.out: weight \[7, 96\] and scales \[7, 5\] must be"):
        torch.ops.etfuse.weight_row_sums.out(q, torch.ones(7, 5), None, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::weight_row_sums.out: zero_points \[7, 2\] must have the scales'"):
        torch.ops.etfuse.weight_row_sums.out(q, torch.ones(7, 3), torch.zeros(7, 2, dtype=torch.int8),
                                             out=torch.empty(0))
    torch.library.opcheck(WEIGHT_ROW_SUMS.aten, (q, scales, None))
    torch.library.opcheck(WEIGHT_ROW_SUMS.aten, (q, torch.rand(7, 3), torch.ones(7, 3, dtype=torch.int8)))


class Mlp(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.up = torch.nn.Linear(64, 128, bias=bias)
        self.down, self.out = torch.nn.Linear(128, 64, bias=False), torch.nn.Linear(64, 32, bias=bias)

    def forward(self, x):
        return self.out(self.down(torch.nn.functional.silu(self.up(x))))


def quantized(model, bits, group=None, mapping=MappingType.SYMMETRIC):
    model = copy.deepcopy(model)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=getattr(torch, f"int{bits}"), weight_granularity=PerGroup(group) if group else PerAxis(0),
        weight_mapping_type=mapping))
    return model


def logits_close(got, want, name):
    """Within float32 rounding of the scales: 1e-3 of the output's largest value. An activation one
    rounding step away after an earlier layer's float32 differences moves the output by one
    quantum of that row, well inside it."""
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()),
                               msg=lambda m: f"{name}: {m}")


TORCHAO_CHAIN = ["torchao.choose_qparams_affine.default", "getitem", "getitem", "torchao.quantize_affine.default",
                 "torchao.dequantize_affine.default"]


@pytest.mark.parametrize("bits,group,mapping,shape,bias", [
    (4, 32, MappingType.SYMMETRIC, (2, 3, 64), True), (4, 64, MappingType.SYMMETRIC, (4, 64), False),
    (8, None, MappingType.SYMMETRIC, (4, 64), True), (4, 32, MappingType.ASYMMETRIC, (4, 64), True),
    (8, 32, MappingType.ASYMMETRIC, (2, 3, 64), False), (8, None, MappingType.ASYMMETRIC, (1, 64), True),
], ids=str)
def test_torchao_models_fuse_and_match_eager(bits, group, mapping, shape, bias):
    torch.manual_seed(0)
    model = quantized(Mlp(bias).eval(), bits, group, mapping)
    x = torch.randn(shape)
    edge = edge_program(model, (x,))
    before = op_names(edge.exported_program().graph_module)
    assert before[:5] == TORCHAO_CHAIN and before.count("torchao.choose_qparams_affine.default") == 3
    fused = etfuse.fuse(edge)
    gm = fused.exported_program().graph_module
    # every linear with its activation chain, the SiLU in the first; the packing folded into a
    # constant; symmetric zero points (all 0) dropped
    assert op_names(gm) == ["etfuse.linear_dq.default"] * 3
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    activations = [n.args[7] if len(n.args) > 7 else n.kwargs.get("activation", "none") for n in calls]
    assert [n.args[5] for n in calls] == [bits] * 3 and activations == ["silu", "none", "none"]
    assert all((n.args[4] is None) == (mapping == MappingType.SYMMETRIC) for n in calls)
    assert all(n.args[1].meta["val"].dtype == (torch.uint8 if bits == 4 else torch.int8) for n in calls)
    # the row sums folded into constants too, equal to the dequantized weight's
    constants = get_constant_placeholder_dict(fused.exported_program())
    for n in calls:
        w, sums, scales = (constants[a] for a in n.args[1:4])
        zp = constants[n.args[4]] if n.args[4] is not None else None
        torch.testing.assert_close(sums, weight_row_sums(w, scales, zp, bits), rtol=1e-7, atol=0)
    want = model(x).detach()
    retraced = fused.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced.graph_module) if n.startswith("etfuse.")]
    # the op's pattern is torchao's math: the fused and retraced programs are eager's
    for name, got in (("fused", fused.exported_program().module()(x)), ("retraced", retraced.module()(x))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    program = fused.to_executorch()
    assert "etfuse::linear_dq.out" in {f"{o.name}.{o.overload}" for o in program.executorch_program.execution_plan[0].operators}
    logits_close(run(program, (x,))[0], want, "runtime")


@pytest.mark.parametrize("bits,bias,shape", [(4, False, (1, 1, 64)), (8, True, (4, 64))], ids=str)
def test_the_residual_add_fuses_into_linear_dq(bits, bias, shape):
    torch.manual_seed(0)
    model = quantized(ResidualMlp(bias).eval(), bits, 32 if bits == 4 else None)
    x = torch.randn(shape)
    fused = etfuse.fuse(edge_program(model, (x,)))
    gm = fused.exported_program().graph_module
    assert op_names(gm) == ["etfuse.linear_dq.default"] * 2
    down = [n for n in gm.graph.nodes if n.op == "call_function"][1]
    assert down.args[8].op == "placeholder"  # the residual is x itself
    logits_close(run(fused.to_executorch(), (x,))[0], model(x).detach(), "runtime")


def test_8da4w_llama_greedy_decoding_matches_eager():
    """executorch's llama export's recipe (8da4w, groups of 32) on its example llama with a KV
    cache: every linear one linear_dq, the MLP's two joined with SwiGLU, both skip connections in
    the epilogues; 32 tokens decoded on the runtime as eager decodes them."""
    model = quantized(example_llama(kv_cache=True, multiple_of=32), 4, 32)
    eager = copy.deepcopy(model)
    out = etfuse.fuse(edge_program(model, (torch.tensor([[1]]), {"input_pos": torch.tensor([0])})))
    ops = op_names(out.exported_program().graph_module)
    assert ops.count("etfuse.linear_dq.default") == 2 * 6 + 1 and not [o for o in ops if o.startswith("torchao.")]
    assert "aten.add.Tensor" not in ops and "aten.mul.Tensor" not in ops
    method = load_method(out.to_executorch())
    assert_greedy_decoding_matches_eager(method, eager, 32, rtol=1e-3, atol=1e-3)


def test_dynamic_sequence_length_fuses_and_runs():
    """executorch's llama export makes the sequence length dynamic: the same linear_dq ops as at a
    static length, and the .pte right at the Dim's min, max and two lengths between."""
    torch.manual_seed(0)
    model = quantized(ResidualMlp(True).eval(), 4, 32)
    seq = torch.export.Dim("T", min=2, max=64)
    edge = edge_program(model, (torch.randn(1, 8, 64),), dynamic_shapes=({1: seq},))
    fused = etfuse.fuse(edge)
    assert op_names(fused.exported_program().graph_module) == ["etfuse.linear_dq.default"] * 2
    program = fused.to_executorch()
    for t in (2, 7, 24, 64):
        x = torch.randn(1, t, 64)
        logits_close(run(program, (x,))[0], model(x).detach(), f"T={t}")
