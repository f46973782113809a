"""Weight-only quantized linears (etfuse::linear_qw, etfuse::pack_int4): the kernels against their
patterns (every ISA, every path: decode dot products, dequantized blocks, the GEMM), named
errors, opcheck; torchao `IntxWeightOnlyConfig` models fused through each route (exact ops;
eager, retrace and runtime equal to eager); an int4 llama decoding 32 tokens greedily as eager
does."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig
from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.quant_api import IntxWeightOnlyConfig, MappingType, quantize_

import etfuse
import etfuse.kernels as kernels
from etfuse.backend_ops import LINEAR_QW, PACK_INT4
from etfuse.passes import default_passes
from etfuse.runtime import load_method, run
from fusion_helpers import (ResidualMlp, assert_fused_matches_eager, assert_greedy_decoding_matches_eager, edge_program,
                            example_llama, op_names, quantized_weight)

TOL = dict(rtol=1e-4, atol=1e-5)


pytestmark = pytest.mark.usefixtures("eager_kernels")


def pack(q):
    return torch.ops.etfuse.pack_int4.out(q, out=torch.empty(0, dtype=torch.uint8))


def linear_qw(*args):
    return torch.ops.etfuse.linear_qw.out(*args, out=torch.empty(0))


# rows: 1 and 3 run the dot products on the quantized weight, 9 and 40 dequantized blocks, 70 the GEMM
@pytest.mark.parametrize("kernel_isa", ["auto", "avx2", "baseline"], indirect=True)
@pytest.mark.parametrize("rows,n,k,group,bits,zero_points,bias", [
    (1, 37, 64, 32, 4, False, True), (3, 40, 96, 96, 8, True, False),
    (2, 11, 160, 32, 4, True, False), (1, 9, 256, 128, 4, True, True), (4, 6, 200, 200, 8, False, True), (9, 13, 72, 36, 8, True, True),
    (40, 20, 64, 32, 4, True, True), (70, 9, 128, 64, 4, False, False), (70, 11, 70, 35, 8, True, True),
], ids=str)
def test_kernel_matches_its_pattern(rows, n, k, group, bits, zero_points, bias, kernel_isa):
    q, w, scales, zp = quantized_weight(n, k, group, bits, zero_points)
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    b = torch.randn(n, generator=gen) if bias else None
    x = torch.randn(rows, k, generator=gen) if rows % 2 else torch.randn(2, rows // 2, k, generator=gen)
    zf = zp.float() if zp is not None else torch.zeros_like(scales)
    dequantized = ((q.float().reshape(n, -1, group) - zf[..., None]) * scales[..., None]).reshape(n, k)
    # float32 sums in another order: errors up to about K ulps of sum |x| |w| (int8 weights reach 13)
    tol = dict(rtol=1e-4, atol=k * 2.0 ** -24 * float((x.abs() @ dequantized.abs().T).max()))
    if kernel_isa == "avx2" and kernels.info().isa not in ("avx512", "avx512vnni"):
        pytest.skip("the AVX2 copy is what 'auto' runs on a CPU without AVX-512")
    r = torch.randn(*x.shape[:-1], n, generator=gen)
    got = {act: linear_qw(x, w, scales, zp, bits, b, act) for act in ("none", "silu")}
    got["strided"] = linear_qw(x.transpose(0, -1).contiguous().transpose(0, -1), w, scales, zp, bits, b, "none")
    # the residual added before the activation, also read through strides
    got["residual"] = linear_qw(x, w, scales, zp, bits, b, "silu", r)
    got["strided residual"] = linear_qw(x, w, scales, zp, bits, b, "silu", r.transpose(0, -1).contiguous().transpose(0, -1))
    for act in ("none", "silu"):
        torch.testing.assert_close(got[act], LINEAR_QW.pattern(x, w, scales, zp, bits, b, act), **tol)
    with_residual = LINEAR_QW.pattern(x, w, scales, zp, bits, b, "silu", r)
    torch.testing.assert_close(with_residual, torch.nn.functional.silu(LINEAR_QW.pattern(x, w, scales, zp, bits, b) + r))
    for key in ("residual", "strided residual"):
        torch.testing.assert_close(got[key], with_residual, **tol)
    torch.testing.assert_close(got["strided"], got["none"], **tol)
    # the pattern is dequantize-then-linear, exactly
    torch.testing.assert_close(LINEAR_QW.pattern(x, w, scales, zp, bits, b), torch.nn.functional.linear(x, dequantized, b),
                               rtol=1e-6, atol=1e-6)


def test_pack_int4_matches_its_pattern_and_round_trips():
    q = torch.randint(-8, 8, (5, 96), dtype=torch.int8)
    packed = pack(q)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 48)
    torch.testing.assert_close(packed, PACK_INT4.pattern(q), rtol=0, atol=0)
    ones = torch.ones(5, 1)
    torch.testing.assert_close(LINEAR_QW.pattern(torch.eye(96), packed, ones, None, 4).T, q.float(), rtol=0, atol=0)


def test_bad_arguments_are_named_and_opcheck():
    q, w, scales, _ = quantized_weight(8, 64, 32, 4, False)
    with pytest.raises(RuntimeError, match=r"etfuse::linear_qw.out: bits must be 8 or 4, got 5"):
        linear_qw(torch.randn(2, 64), w, scales, None, 5, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::linear_qw.out: weight \[8, 32\] does not hold 48 input features"):
        linear_qw(torch.randn(2, 48), w, scales, None, 4, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::linear_qw.out: weight must be Byte, got Char"):
        linear_qw(torch.randn(2, 64), q, scales, None, 4, None, "none")
    with pytest.raises(RuntimeError, match=r"4-bit groups of 16 columns; the packing needs a multiple of 32"):
        linear_qw(torch.randn(2, 64), w, torch.ones(8, 4), None, 4, None, "none")
    with pytest.raises(RuntimeError, match=r"etfuse::pack_int4.out: weight must be \[N, K\] with K a multiple of 32"):
        pack(torch.zeros(3, 40, dtype=torch.int8))
    torch.library.opcheck(PACK_INT4.aten, (q,))
    with pytest.raises(RuntimeError, match=r"etfuse::linear_qw.out: residual must have the output.s shape \[2, 8\], got \[2, 9\]"):
        linear_qw(torch.randn(2, 64), w, scales, None, 4, None, "none", torch.randn(2, 9))
    for args in ((torch.randn(3, 64), w, scales, None, 4, torch.randn(8), "silu"),
                 (torch.randn(2, 2, 64), q, scales, torch.ones(8, 2, dtype=torch.int8), 8, None, "none"),
                 (torch.randn(2, 2, 64), w, scales, None, 4, None, "none", torch.randn(2, 2, 8))):
        torch.library.opcheck(LINEAR_QW.aten, args)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.out = torch.nn.Linear(64, 96), torch.nn.Linear(96, 64, bias=False), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.out(self.down(torch.nn.functional.silu(self.up(x))))


def quantized(model, bits, group=None, mapping=MappingType.SYMMETRIC):
    model = copy.deepcopy(model)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"),
                                          granularity=PerGroup(group) if group else PerAxis(0), mapping_type=mapping))
    return model


@pytest.mark.parametrize("bits,group,mapping,shape", [
    (4, 32, MappingType.SYMMETRIC, (2, 3, 64)), (8, None, MappingType.SYMMETRIC, (4, 64)),
    (4, 32, MappingType.ASYMMETRIC, (4, 64)), (8, 32, MappingType.ASYMMETRIC, (2, 3, 64)),
], ids=str)
def test_torchao_models_fuse_and_match_eager(bits, group, mapping, shape):
    torch.manual_seed(0)
    model = quantized(Mlp().eval(), bits, group, mapping)
    x = torch.randn(shape)
    fused = etfuse.fuse(edge_program(model, (x,)))
    gm = fused.exported_program().graph_module
    # every linear fused, the SiLU in the first; the packing folded into a constant; symmetric
    # zero points (all 0) dropped
    assert op_names(gm) == ["etfuse.linear_qw.default"] * 3
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    activations = [n.args[6] if len(n.args) > 6 else n.kwargs.get("activation", "none") for n in calls]
    assert [n.args[4] for n in calls] == [bits] * 3 and activations == ["silu", "none", "none"]
    assert all((n.args[3] is None) == (mapping == MappingType.SYMMETRIC) for n in calls)
    assert_fused_matches_eager(model, (x,), fused, **TOL)


@pytest.mark.parametrize("bits,bias,shape", [(4, False, (1, 1, 64)), (8, True, (4, 64)), (4, True, (2, 3, 64))], ids=str)
def test_the_residual_add_fuses_into_linear_qw(bits, bias, shape):
    torch.manual_seed(0)
    model = quantized(ResidualMlp(bias).eval(), bits, 32 if bits == 4 else None)
    x = torch.randn(shape)
    fused = etfuse.fuse(edge_program(model, (x,)))
    gm = fused.exported_program().graph_module
    assert op_names(gm) == ["etfuse.linear_qw.default"] * 2
    down = [n for n in gm.graph.nodes if n.op == "call_function"][1]
    assert down.args[7].op == "placeholder"  # the residual is x itself
    assert_fused_matches_eager(model, (x,), fused, **TOL)


def test_backend_config_route_packs_on_the_runtime():
    """transform(default_passes()) gives fuse's program; ExecutorchBackendConfig(passes=...) has no
    weight values, so pack_int4 stays in the program and runs per call: same numbers."""
    torch.manual_seed(0)
    model = quantized(Mlp().eval(), 4, 32)
    x = torch.randn(2, 3, 64)
    edge = edge_program(model, (x,))
    transformed = copy.deepcopy(edge).transform(default_passes())
    assert op_names(transformed.exported_program().graph_module) == ["etfuse.linear_qw.default"] * 3
    program = copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    assert op_names(program.exported_program().graph_module).count("etfuse.pack_int4.out") == 3
    want = model(x)
    for p in (transformed.to_executorch(), program):
        torch.testing.assert_close(run(p, (x,))[0], want, **TOL)


def test_int4_llama_greedy_decoding_matches_eager():
    model = quantized(example_llama(kv_cache=True, multiple_of=32), 4, 32)  # hidden dim a multiple of the group
    eager = copy.deepcopy(model)
    out = etfuse.fuse(edge_program(model, (torch.tensor([[1]]), {"input_pos": torch.tensor([0])})))
    ops = op_names(out.exported_program().graph_module)
    # per layer q, k, v, o, w2 and w1 joined with w3 (GatedLinearsPass), then the output
    assert ops.count("etfuse.linear_qw.default") == 2 * 6 + 1 and "torchao.dequantize_affine.default" not in ops
    assert "aten.add.Tensor" not in ops  # both skip connections of each layer in linear_qw's epilogue
    assert "aten.mul.Tensor" not in ops  # SwiGLU's product in the joined linear's epilogue
    method = load_method(out.to_executorch())
    assert_greedy_decoding_matches_eager(method, eager, 32, **TOL)  # the issue asks for 32 tokens


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 64)], ids=str)
def test_an_activation_without_a_weight_only_rule_stays_after_linear_qw(shape):
    """A GELU after a quantized linear: the float rules (linear_act with GELU) decline a weight that
    `dequantize_affine` produces, which the runtime could not run; linear_qw takes the linear."""
    torch.manual_seed(0)
    model = quantized(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU()).eval(), 8)
    x = torch.randn(shape)
    fused = etfuse.fuse(edge_program(model, (x,)))
    assert op_names(fused.exported_program().graph_module) == ["etfuse.linear_qw.default", "aten.gelu.default"]
    assert_fused_matches_eager(model, (x,), fused, **TOL)
