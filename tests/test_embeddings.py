"""Quantized embeddings: `embedding_byte`, `embedding_4bit`, `embedding_2bit` (+ `.dtype`), the
packing op, their kernels (eager and runtime, bit for bit against the ops' patterns and against
the dequantize -> embedding chains they replace), and the fusion of torchao's
`IntxWeightOnlyConfig` embeddings through `etfuse.fuse`."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
from executorch.exir.passes.quant_fusion_pass import _get_node_value_dict

import etfuse
import etfuse.backend_ops as bo
import etfuse.kernels
from etfuse.backend_ops import runtime_op
from etfuse.backend_ops import embedding_ops as E
from etfuse.passes import EmitRuntimeNamesPass, FoldPackedWeightsPass, QuantFusionPass, default_passes
from etfuse.runtime import run
from fusion_helpers import op_names

qd = torch.ops.quantized_decomposed
pack = torch.ops.quant_fusion._pack_embedding_weight.default
I8, U8, F32, F16, BF16 = torch.int8, torch.uint8, torch.float32, torch.float16, torch.bfloat16
RANGE = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}
NAME = {8: "embedding_byte", 4: "embedding_4bit", 2: "embedding_2bit"}
RECORD = {8: (E.EMBEDDING_BYTE, E.EMBEDDING_BYTE_DTYPE), 4: (E.EMBEDDING_4BIT, E.EMBEDDING_4BIT_DTYPE),
          2: (E.EMBEDDING_2BIT, E.EMBEDDING_2BIT_DTYPE)}


pytestmark = pytest.mark.usefixtures("eager_kernels")


def table(bits, n=12, d=64, groups=1, sdt=F32, zp=True, seed=0):
    """(values int8 [n, d], stored weight, scales [n] or [n, groups], zero points or None)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = RANGE[bits]
    v = torch.randint(lo, hi + 1, (n, d), dtype=I8, generator=g)
    s = (torch.rand(n, groups, generator=g) * 0.05 + 1e-3).to(sdt)
    s = s.reshape(n) if groups == 1 else s
    z = torch.randint(lo, hi + 1, s.shape, dtype=I8, generator=g) if zp else None
    return v, (v if bits == 8 else pack(v, bits)), s, z


def chain(v, s, z, bits, out_dtype):
    """The unfused program's computation: torchao's dequantize_affine, then embedding."""
    d = v.shape[1]
    groups = s.shape[1] if s.dim() == 2 else 1
    w = torch.ops.torchao.dequantize_affine(v, [1, d // groups], s, z, I8, *RANGE[bits], out_dtype)
    return lambda idx: torch.nn.functional.embedding(idx, w)


def test_opcheck():
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    idx = torch.tensor([[1, 0], [11, 3]])
    for bits in (8, 4, 2):
        _, w, s, z = table(bits, groups=2, sdt=F16)
        args = (w, s, z, *RANGE[bits], idx)
        plain, dtyped = RECORD[bits]
        torch.library.opcheck(plain.aten, args, test_utils=utils)
        torch.library.opcheck(runtime_op(plain).aten_out, args, {"out": torch.empty(2, 2, 64, dtype=F16)}, test_utils=utils)
        torch.library.opcheck(dtyped.aten, args, {"dtype": BF16}, test_utils=utils)
        torch.library.opcheck(runtime_op(dtyped).aten_out, args, {"dtype": BF16, "out": torch.empty(2, 2, 64, dtype=BF16)},
                              test_utils=utils)
    v = torch.randint(-8, 8, (6, 8), dtype=I8)
    torch.library.opcheck(E.PACK_EMBEDDING_WEIGHT.aten, (v, 4), test_utils=utils)
    torch.library.opcheck(E.PACK_EMBEDDING_WEIGHT.aten_out, (v, 2), {"out": torch.empty(6, 2, dtype=U8)},
                          test_utils=utils)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_eager_kernel_bit_exact(bits):
    """The compiled `.out` kernels against the ops' patterns and against dequantize_affine ->
    embedding: per-axis and groupwise, with and without zero points, every scale and out dtype."""
    idx = torch.tensor([[0, 11, 5], [5, 3, 7]])
    plain, dtyped = RECORD[bits]
    for groups in (1, 4):
        for zp in (True, False):
            for sdt in (F32, F16, BF16):
                v, w, s, z = table(bits, groups=groups, sdt=sdt, zp=zp, seed=groups + 7 * zp)
                args = (w, s, z, *RANGE[bits], idx)
                got = runtime_op(plain).aten_out(*args, out=torch.empty(0, dtype=sdt))
                assert torch.equal(got, plain.pattern(*args)), (groups, zp, sdt)
                assert torch.equal(got, chain(v, s, z, bits, sdt)(idx)), (groups, zp, sdt)
                for out_dtype in (F32, F16, BF16):
                    got = runtime_op(dtyped).aten_out(*args, dtype=out_dtype, out=torch.empty(0, dtype=out_dtype))
                    assert torch.equal(got, dtyped.pattern(*args, dtype=out_dtype)), (groups, zp, sdt, out_dtype)
                    assert torch.equal(got, chain(v, s, z, bits, out_dtype)(idx)), (groups, zp, sdt, out_dtype)


def test_eager_kernel_layouts_and_isas():
    """Strided tables, int32 indices, uint8 bytes, zero points of other dtypes, and the baseline
    (no AVX2) loops give the same bits."""
    v, w, s, z = table(4, n=9, d=96, groups=3)
    idx = torch.tensor([8, 0, 4, 4])
    want = E._embedding_4bit(w, s, z, -8, 7, idx)
    strided = torch.empty(9, 96, dtype=U8)[:, ::2]
    strided.copy_(w)
    assert not strided.is_contiguous()
    assert torch.equal(torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(strided, s, z, -8, 7, idx.int(), out=torch.empty(0)), want)
    assert torch.equal(torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, s, z.float(), -8, 7, idx, out=torch.empty(0)), want)
    assert torch.equal(torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, s.t().contiguous().t(), z.long(), -8, 7, idx, out=torch.empty(0)), want)
    u = torch.randint(0, 256, (5, 24), dtype=U8)
    su, zu = torch.rand(5, 2), torch.randint(0, 256, (5, 2), dtype=U8)
    assert torch.equal(torch.ops.etfuse.quantized_decomposed_embedding_byte.out(u.t().contiguous().t(), su, zu, 0, 255, idx[1:3], out=torch.empty(0)),
                       E._embedding_byte(u, su, zu, 0, 255, idx[1:3]))
    etfuse.kernels.set_isa("baseline")
    try:
        for bits in (8, 4, 2):
            v, w, s, z = table(bits, groups=2)
            args = (w, s, z, *RANGE[bits], idx)
            assert torch.equal(runtime_op(RECORD[bits][0]).aten_out(*args, out=torch.empty(0)), RECORD[bits][0].pattern(*args))
    finally:
        etfuse.kernels.set_isa("auto")


def test_eager_errors():
    _, w, s, z = table(4)
    with pytest.raises(RuntimeError, match=r"embedding_4bit.out: index 12 is out of range for 12 rows"):
        torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, s, z, -8, 7, torch.tensor([0, 12]), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"embedding_2bit.dtype_out: index -1 is out of range for 12 rows"):
        torch.ops.etfuse.quantized_decomposed_embedding_2bit.dtype_out(pack(torch.zeros(12, 8, dtype=I8), 2), s, None, -2, 1, torch.tensor([-1]),
                                    dtype=F16, out=torch.empty(0, dtype=F16))
    with pytest.raises(RuntimeError, match=r"weight must be uint8 \(2 values packed per byte\), got Char"):
        torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w.view(I8), s, z, -8, 7, torch.tensor([0]), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"quant range \[-128, 127\] is not inside \[-8, 7\]"):
        torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, s, z, -128, 127, torch.tensor([0]), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"5 scale groups do not divide D = 64"):
        torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, torch.ones(12, 5), None, -8, 7, torch.tensor([0]), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"weight_zero_points must be \[N\], \[N, 1\] or \[N, G\]"):
        torch.ops.etfuse.quantized_decomposed_embedding_4bit.out(w, torch.ones(12, 2), torch.zeros(12, 4), -8, 7, torch.tensor([0]), out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"out must have dtype Half, got Float"):
        torch.ops.etfuse.quantized_decomposed_embedding_byte.out(torch.zeros(3, 4, dtype=I8), torch.ones(3, dtype=F16), None, -128, 127,
                              torch.tensor([0]), out=torch.empty(0))


class DirectOps(torch.nn.Module):
    """Every embedding op and the packing, called directly on the inputs (for the runtime)."""

    def forward(self, v8, v4, v2, s, z, idx):
        w4, w2 = pack(v4, 4), pack(v2, 2)
        return (qd.embedding_byte.default(v8, s, z, -128, 127, idx),
                qd.embedding_byte.dtype(v8, s, None, -128, 127, idx, dtype=F16),
                qd.embedding_4bit.default(w4, s, None, -8, 7, idx),
                qd.embedding_4bit.dtype(w4, s, z, -8, 7, idx, dtype=BF16),
                qd.embedding_2bit.default(w2, s, z, -2, 1, idx),
                qd.embedding_2bit.dtype(w2, s, None, -2, 1, idx, dtype=F32))


def test_runtime_matches_eager_and_refuses_bad_indices():
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randint(-128, 128, (16, 64), dtype=I8, generator=g),
              torch.randint(-8, 8, (16, 64), dtype=I8, generator=g),
              torch.randint(-2, 2, (16, 64), dtype=I8, generator=g),
              torch.rand(16, 4, generator=g) + 0.01, torch.randint(-2, 2, (16, 4), dtype=I8, generator=g),
              torch.tensor([[3, 15, 0], [7, 7, 1]]))
    m = DirectOps()
    ep = to_edge(torch.export.export(m, inputs), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    # the lowering step that calls etfuse's kernels by their own names (passes/runtime_names.py)
    program = ep.to_executorch(ExecutorchBackendConfig(passes=[EmitRuntimeNamesPass()]))
    names = {o.name + "." + o.overload for o in program.executorch_program.execution_plan[0].operators}
    assert names == {"quant_fusion::_pack_embedding_weight.out", "etfuse::quantized_decomposed_embedding_byte.out",
                     "etfuse::quantized_decomposed_embedding_byte.dtype_out",
                     "etfuse::quantized_decomposed_embedding_4bit.out",
                     "etfuse::quantized_decomposed_embedding_4bit.dtype_out",
                     "etfuse::quantized_decomposed_embedding_2bit.out",
                     "etfuse::quantized_decomposed_embedding_2bit.dtype_out"}
    got = run(program, inputs)
    for a, b in zip(got, m(*inputs)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    with pytest.raises(RuntimeError):  # index 16 of 16 rows: the method fails, the process lives on
        run(program, (*inputs[:5], torch.tensor([[3, 16, 0], [7, 7, 1]])))


# ---- fusion ----------------------------------------------------------------------------------

def torchao_model(dtype):
    """Six embeddings quantized by torchao's IntxWeightOnlyConfig: 2, 4 and 8 bits, PerGroup(32)
    symmetric (zero points all 0) and PerAxis(0) asymmetric."""
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.quant_primitives import MappingType

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = [f"e{bits}{kind}" for kind in ("g", "a") for bits in (2, 4, 8)]
            for name in self.names:
                setattr(self, name, torch.nn.Embedding(20, 64))

        def forward(self, i):
            return tuple(getattr(self, name)(i) for name in self.names)

    torch.manual_seed(0)
    m = M().to(dtype).eval()
    for bits in (2, 4, 8):
        for kind, granularity, mapping in (("g", PerGroup(32), MappingType.SYMMETRIC),
                                           ("a", PerAxis(0), MappingType.ASYMMETRIC)):
            quantize_(m, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=granularity,
                                              mapping_type=mapping), lambda mod, fqn, n=f"e{bits}{kind}": fqn == n)
    return m


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_torchao_models_fuse_and_match_eager(dtype):
    idx = torch.tensor([[1, 19, 4], [0, 4, 7]])
    overload = "default" if dtype == F32 else "dtype"
    m = torchao_model(dtype)
    edge = to_edge(torch.export.export(m, (idx,)))
    before = copy.deepcopy(edge.exported_program().state_dict)
    fused = etfuse.fuse(edge)
    gm = fused.exported_program().graph_module
    ops = [f"quantized_decomposed.embedding_{w}.{overload}" for w in ("2bit", "4bit", "byte")]
    assert op_names(gm) == ops + ops  # no pack op, no dequantize left
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    # symmetric (the first three): all-zero zero points dropped; asymmetric ones kept
    assert [n.args[2] is None for n in nodes] == [True] * 3 + [False] * 3
    # the packed tables are constants of the program: uint8, D / 4 and D / 2 columns
    consts = fused.exported_program().constants
    assert [tuple(consts[nodes[k].args[0].name].shape) for k in (0, 1, 3, 4)] == [(20, 16), (20, 32)] * 2
    assert all(consts[nodes[k].args[0].name].dtype == U8 for k in (0, 1, 3, 4))
    # the caller's program is as it was
    assert edge.exported_program().state_dict.keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in edge.exported_program().state_dict.items())
    assert op_names(edge.exported_program().graph_module).count("torchao.dequantize_affine.default") == 6
    got, want = run(fused.to_executorch(), (idx,)), m(idx)
    for a, b in zip(got, want):
        assert a.dtype == dtype and torch.equal(a, b)


def test_transform_and_backend_config_routes():
    """transform(default_passes()) gives fuse's program; ExecutorchBackendConfig(passes=...) has no
    weight values, so the packing stays an op and runs on the runtime, with the same numbers."""
    idx = torch.tensor([3, 0, 19])
    m = torchao_model(F32)
    edge = to_edge(torch.export.export(m, (idx,)))
    fused = etfuse.fuse(edge)
    transformed = edge.transform(default_passes())
    # transform ran the lowering's naming step too (passes/runtime_names.py): the same ops, etfuse's names
    assert op_names(transformed.exported_program().graph_module) == [
        n.replace("quantized_decomposed.", "etfuse.quantized_decomposed_") for n in op_names(fused.exported_program().graph_module)]
    program = copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    names = [o.name for o in program.executorch_program.execution_plan[0].operators]
    assert names.count("quant_fusion::_pack_embedding_weight") == 1  # one .out kernel, used by four nodes
    want = m(idx)
    for outs in (run(program, (idx,)), run(transformed.to_executorch(), (idx,))):
        assert all(torch.equal(a, b) for a, b in zip(outs, want))


def test_fold_pass_on_a_graph_module_keeps_the_pack_op():
    m = torchao_model(F32)
    edge = to_edge(torch.export.export(m, (torch.tensor([1]),)))
    gm = QuantFusionPass()(edge.exported_program().graph_module).graph_module
    res = FoldPackedWeightsPass()(gm)
    assert res.graph_module is not gm
    assert op_names(res.graph_module).count("quant_fusion._pack_embedding_weight.default") == 4


class GroupDequantize(torch.nn.Module):
    """quantized_decomposed.dequantize_per_channel_group -> embedding, int4 values."""

    def __init__(self, scale_dtype, out_dtype, zp_dtype=I8):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randint(-8, 8, (10, 64), dtype=I8, generator=g))
        self.register_buffer("s", (torch.rand(10, 2, generator=g) * 0.1 + 0.01).to(scale_dtype))
        self.register_buffer("z", torch.randint(-8, 8, (10, 2), dtype=I8, generator=g).to(zp_dtype))
        self.out_dtype = out_dtype

    def forward(self, i):
        w = qd.dequantize_per_channel_group.default(self.w, self.s, self.z, -8, 7, I8, 32, self.out_dtype)
        return torch.nn.functional.embedding(i, w)


def test_dequantize_per_channel_group_form():
    idx = torch.tensor([[9, 0], [2, 2]])
    for scale_dtype, out_dtype, rule in ((F32, F32, "embedding_4bit_group"), (F16, F16, "embedding_4bit_group_dtype"),
                                         (F32, BF16, "embedding_4bit_group_dtype")):
        m = GroupDequantize(scale_dtype, out_dtype, torch.int32)
        edge = to_edge(torch.export.export(m, (idx,)))
        p = QuantFusionPass(node_value_dict=_get_node_value_dict(edge.exported_program()))
        p(copy.deepcopy(edge.exported_program().graph_module))
        assert p.report.counts() == {rule: 1}, p.report.declined
        (got,) = run(etfuse.fuse(edge).to_executorch(), (idx,))
        assert torch.equal(got, m(idx))
    # int8 zero points, seen in [-8, 7] or not seen at all: the op that wraps q - zp in int8 as the
    # pattern does, on every route (a choice on their values would split fuse from transform)
    edge = to_edge(torch.export.export(GroupDequantize(F32, F32), (idx,)))
    for p in (QuantFusionPass(node_value_dict=_get_node_value_dict(edge.exported_program())), QuantFusionPass()):
        p(copy.deepcopy(edge.exported_program().graph_module))
        assert p.report.counts() == {"embedding_4bit_group_int8_zp": 1}, p.report.declined
    # float16 scales, float32 out: the pattern rounds the product to float16 first; the kernel would not
    edge = to_edge(torch.export.export(GroupDequantize(F16, F32), (idx,)))
    p = QuantFusionPass()
    p(edge.exported_program().graph_module)
    assert p.report.fused == []
    assert ("the pattern rounds (q - zp) * scale to torch.float16 before the torch.float32 output; the kernel "
            "rounds once") in {d.reason for d in p.report.declined}


def test_op_table_lists_the_embeddings():
    names = {op.qualname for op in bo.CATALOG}
    assert {"quantized_decomposed::embedding_byte.dtype", "quantized_decomposed::embedding_4bit",
            "quantized_decomposed::embedding_4bit.dtype", "quantized_decomposed::embedding_2bit",
            "quantized_decomposed::embedding_2bit.dtype", "quant_fusion::_pack_embedding_weight"} <= names


# ---- int8 zero points of an 8-bit group table ------------------------------------------------

def _wrap_table(n=8, d=16, groups=2, sdt=F32, seed=5):
    """int8 values and int8 zero points that reach both ends: q - zp leaves int8 both ways."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randint(-128, 128, (n, d), dtype=I8, generator=g)
    v[0], v[1] = 127, -128
    v[2, ::2], v[2, 1::2] = 127, -128
    s = (torch.rand(n, groups, generator=g) * 0.05 + 1e-3).to(sdt)
    z = torch.randint(-128, 128, (n, groups), dtype=I8, generator=g)
    z[0], z[1], z[2, 0], z[2, -1] = -128, 127, -128, 127
    return v, s, z


def _group_chain(v, s, z, out_dtype):
    """The unfused program: dequantize_per_channel_group (int8 - int8 in int8), then embedding."""
    w = qd.dequantize_per_channel_group.default(v, s, z, -128, 127, I8, v.shape[1] // s.shape[1], out_dtype)
    return lambda idx: torch.nn.functional.embedding(idx, w)


def test_int8_zero_points_wrap_as_dequantize_per_channel_group_does():
    """etfuse::embedding_byte_int8_zp: q - zp in int8, wrapping (127 - -128 = -1), as the unfused
    program computes it; its pattern, its compiled kernel (AVX2 and baseline loops, strided tables,
    int32 indices) and dequantize_per_channel_group -> embedding agree bit for bit."""
    op = bo.EMBEDDING_BYTE_INT8_ZP
    idx = torch.tensor([[0, 1, 2], [7, 2, 0]])
    v, s, z = _wrap_table()
    want = _group_chain(v, s, z, F32)(idx)
    assert want[0, 0, 0] == -s[0, 0] and want[0, 1, 0] == s[1, 0]  # wrapped: -1 * s and +1 * s
    torch.library.opcheck(op.aten, (v, s, z, -128, 127, idx), {"dtype": BF16},
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    for isa in ("auto", "baseline"):
        etfuse.kernels.set_isa(isa)
        try:
            for sdt in (F32, F16, BF16):
                v, s, z = _wrap_table(sdt=sdt)
                strided = torch.empty(8, 32, dtype=I8)[:, ::2]
                strided.copy_(v)
                for out_dtype in (F32, F16, BF16):
                    if sdt != F32 and out_dtype != sdt:
                        continue  # the pattern rounds the product to the scales' dtype first (the rule declines)
                    want = _group_chain(v, s, z, out_dtype)(idx)
                    assert torch.equal(op.pattern(v, s, z, -128, 127, idx, dtype=out_dtype), want), (sdt, out_dtype)
                    for w, i in ((v, idx), (strided, idx.int())):
                        got = op.aten_out(w, s, z, -128, 127, i, dtype=out_dtype, out=torch.empty(0, dtype=out_dtype))
                        assert torch.equal(got, want), (isa, sdt, out_dtype)
                # no zero points: embedding_byte's q * s
                got = op.aten_out(v, s, None, -128, 127, idx, out=torch.empty(0, dtype=sdt))
                assert torch.equal(got, E._embedding_byte(v, s, None, -128, 127, idx))
        finally:
            etfuse.kernels.set_isa("auto")
    with pytest.raises(RuntimeError, match=r"weight and weight_zero_points must be int8, got Char and Int"):
        op.aten_out(v, s, z.int(), -128, 127, idx, out=torch.empty(0, dtype=BF16))


class Int8GroupDequantize(torch.nn.Module):
    """dequantize_per_channel_group -> embedding: 8 bits, int8 zero points at the int8 ends."""

    def __init__(self, scale_dtype, out_dtype):
        super().__init__()
        v, s, z = _wrap_table(n=10, d=64, groups=2, sdt=scale_dtype)
        self.register_buffer("w", v)
        self.register_buffer("s", s)
        self.register_buffer("z", z)
        self.out_dtype = out_dtype

    def forward(self, i):
        w = qd.dequantize_per_channel_group.default(self.w, self.s, self.z, -128, 127, I8, 32, self.out_dtype)
        return torch.nn.functional.embedding(i, w)


@pytest.mark.parametrize("scale_dtype, out_dtype", [(F32, F32), (F32, F16), (BF16, BF16)])
def test_int8_zero_points_near_the_ends_on_every_route(scale_dtype, out_dtype):
    """q = 127 with zp = -128 (and q = -128 with zp = 127): the unfused program wraps q - zp in int8;
    etfuse.fuse, edge.transform(default_passes()) and the config route (no weight values) all
    write embedding_byte_int8_zp, and each `.pte` gives eager's bits on the runtime."""
    idx = torch.tensor([[0, 1], [2, 9]])
    m = Int8GroupDequantize(scale_dtype, out_dtype)
    want = m(idx)
    assert want[0, 0, 0] == (-m.s[0, 0]).to(out_dtype)  # 127 - -128 wrapped to -1
    edge = to_edge(torch.export.export(m, (idx,)))
    fused = etfuse.fuse(edge)
    assert op_names(fused.exported_program().graph_module) == ["etfuse.embedding_byte_int8_zp.default"]
    programs = {"fuse": fused.to_executorch(), "transform": copy.deepcopy(edge).transform(default_passes()).to_executorch(),
                "config": copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))}
    for route, program in programs.items():
        names = {o.name for o in program.executorch_program.execution_plan[0].operators}
        assert names == {"etfuse::embedding_byte_int8_zp"}, (route, names)
        (got,) = run(program, (idx,))
        assert got.dtype == out_dtype and torch.equal(got, want), route


def test_all_zero_int8_zero_points_are_dropped():
    """A symmetric 8-bit group table with int8 zero points: fused as embedding_byte_int8_zp whatever
    the values (the config route cannot see them), then FoldPackedWeightsPass drops the zeros."""
    m = Int8GroupDequantize(F32, F32)
    m.z.zero_()
    idx = torch.tensor([4, 0])
    fused = etfuse.fuse(to_edge(torch.export.export(m, (idx,))))
    (node,) = [n for n in fused.exported_program().graph_module.graph.nodes if n.op == "call_function"]
    assert node.target.name() == "etfuse::embedding_byte_int8_zp" and node.args[2] is None
    (got,) = run(fused.to_executorch(), (idx,))
    assert torch.equal(got, m(idx))


# ---- int8 zero points of 4-bit and 2-bit group tables ----------------------------------------

def _sub_byte_table(bits, group_size, sdt, wide, n=10, d=64, seed=11):
    """Values in the width's range; int8 zero points over all of int8 (`wide` True: rows 0 and 1 at
    -128 and 127, so q - zp leaves int8 both ways), inside the width's range (False), all 0
    ("zeros"), or int32 zero points inside the width's range ("int32")."""
    g = torch.Generator().manual_seed(seed + bits)
    lo, hi = RANGE[bits]
    v = torch.randint(lo, hi + 1, (n, d), dtype=I8, generator=g)
    v[0], v[1] = hi, lo
    s = (torch.rand(n, d // group_size, generator=g) * 0.05 + 1e-3).to(sdt)
    if wide == "zeros":
        z = torch.zeros(s.shape, dtype=I8)
    elif wide == "int32":
        z = torch.randint(lo, hi + 1, s.shape, dtype=torch.int32, generator=g)
    elif wide:
        z = torch.randint(-128, 128, s.shape, dtype=I8, generator=g)
        z[0], z[1] = -128, 127
    else:
        z = torch.randint(lo, hi + 1, s.shape, dtype=I8, generator=g)
    return v, s, z


class SubByteGroupDequantize(torch.nn.Module):
    """dequantize_per_channel_group (or torchao's dequantize_affine) -> embedding at 4 or 2 bits,
    int8 zero points."""

    def __init__(self, form, bits, group_size, scale_dtype, out_dtype, wide):
        super().__init__()
        v, s, z = _sub_byte_table(bits, group_size, scale_dtype, wide)
        self.register_buffer("w", v)
        self.register_buffer("s", s)
        self.register_buffer("z", z)
        self.form, self.bits, self.group_size, self.out_dtype = form, bits, group_size, out_dtype

    def forward(self, i):
        lo, hi = RANGE[self.bits]
        if self.form == "group":
            w = qd.dequantize_per_channel_group.default(self.w, self.s, self.z, lo, hi, I8, self.group_size, self.out_dtype)
        else:
            w = torch.ops.torchao.dequantize_affine(self.w, [1, self.group_size], self.s, self.z, I8, lo, hi, self.out_dtype)
        return torch.nn.functional.embedding(i, w)


_SUB_BYTE_CASES = [  # (form, group size, scale dtype, out dtype)
    ("group", 16, F32, F32), ("group", 32, F32, BF16), ("group", 64, BF16, BF16), ("group", 32, F16, F16),
    ("group", 16, F32, F16), ("affine", 32, F32, F32), ("affine", 16, BF16, BF16),
]


# all zero and int32 zero points: the forms and dtypes whose rules differ (CI time)
_KINDS = {True: "int8_zp", False: "in_range_zp", "zeros": "zero_zp", "int32": "int32_zp"}
_ZERO_POINT_CASES = [
    pytest.param(form, g, sdt, odt, wide, id=f"{form}-{g}-{str(sdt)[6:]}-{str(odt)[6:]}-{_KINDS[wide]}")
    for cases, kinds in ((_SUB_BYTE_CASES, (True, False)),
                         ((_SUB_BYTE_CASES[1], _SUB_BYTE_CASES[2], _SUB_BYTE_CASES[6]), ("zeros", "int32")))
    for form, g, sdt, odt in cases for wide in kinds]


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("form, group_size, scale_dtype, out_dtype, wide", _ZERO_POINT_CASES)
def test_sub_byte_zero_points_on_every_route(bits, wide, form, group_size, scale_dtype, out_dtype):
    """4- and 2-bit group tables whose int8 zero points lie anywhere in int8: the unfused program
    subtracts them in int8 (dequantize_per_channel_group wraps: 7 - -128 is -121) or in the output
    dtype (dequantize_affine: exact); int32 zero points, in the quant range as quantizers make them.
    etfuse.fuse, transform(default_passes()) and the config route (no weight values) each fuse the
    embedding to the same plan, and the fused program (eager) and every `.pte` give eager's bits
    (int32 zero points of dequantize_affine unseen stopped the config route: fuzz seed 44, graph 357)."""
    idx = torch.tensor([[0, 1], [5, 9], [1, 0]])
    m = SubByteGroupDequantize(form, bits, group_size, scale_dtype, out_dtype, wide)
    want = m(idx)
    if wide is True and form == "group":  # the reference wraps: q = hi with zp = -128 leaves int8
        exact = (m.w[0, 0].float() - m.z[0, 0].float()) * m.s[0, 0].float()
        assert want[0, 0, 0] != exact.to(out_dtype)
    edge = to_edge(torch.export.export(m, (idx,)))
    fused = etfuse.fuse(copy.deepcopy(edge))
    assert not [n for n in op_names(fused.exported_program().graph_module) if "dequantize" in n]
    assert torch.equal(fused.exported_program().module()(idx), want)
    programs = {"fuse": fused.to_executorch(), "transform": copy.deepcopy(edge).transform(default_passes()).to_executorch(),
                "config": copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))}
    plans = {route: sorted(o.name for o in p.executorch_program.execution_plan[0].operators)
             for route, p in programs.items()}
    # transform promises etfuse.fuse's plan; a choice on zero-point values (which fuse sees and
    # transform does not) broke that for in-range and all-zero zero points (the fuzz run's graph 429)
    assert plans["transform"] == plans["fuse"], plans
    for route, program in programs.items():
        names = set(plans[route])
        assert not [n for n in names if "dequantize" in n], (route, names)
        (got,) = run(program, (idx,))
        assert got.dtype == out_dtype and torch.equal(got, want), route


@pytest.mark.parametrize("bits", [4, 2])
def test_packed_int8_zero_points_wrap_as_dequantize_per_channel_group_does(bits):
    """etfuse::embedding_{4bit,2bit}_int8_zp on the packed table: its pattern, its compiled kernel
    (AVX2 and baseline loops; groups whose zero point cannot wrap take the plain loops) and
    dequantize_per_channel_group -> embedding agree bit for bit, zero points anywhere in int8."""
    op = {4: bo.EMBEDDING_4BIT_INT8_ZP, 2: bo.EMBEDDING_2BIT_INT8_ZP}[bits]
    lo, hi = RANGE[bits]
    idx = torch.tensor([[0, 1, 2], [9, 2, 0]])
    v, s, z = _sub_byte_table(bits, 16, F32, True)
    z[2] = torch.tensor([0, hi - 127, lo + 128, hi - 128])  # cannot wrap (three) and wraps (the last)
    w = pack(v, bits)
    torch.library.opcheck(op.aten, (w, s, z, lo, hi, idx), {"dtype": BF16},
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    for isa in ("auto", "baseline"):
        etfuse.kernels.set_isa(isa)
        try:
            for sdt, out_dtype in ((F32, F32), (F32, F16), (F32, BF16), (F16, F16), (BF16, BF16)):
                s2 = s.to(sdt)
                ref = qd.dequantize_per_channel_group.default(v, s2, z, lo, hi, I8, 16, out_dtype)
                want = torch.nn.functional.embedding(idx, ref)
                assert torch.equal(op.pattern(w, s2, z, lo, hi, idx, dtype=out_dtype), want), (sdt, out_dtype)
                got = op.aten_out(w, s2, z, lo, hi, idx.int(), dtype=out_dtype, out=torch.empty(0, dtype=out_dtype))
                assert torch.equal(got, want), (isa, sdt, out_dtype)
            got = op.aten_out(w, s, None, lo, hi, idx, out=torch.empty(0))
            assert torch.equal(got, RECORD[bits][0].pattern(w, s, None, lo, hi, idx))
        finally:
            etfuse.kernels.set_isa("auto")
    with pytest.raises(RuntimeError, match=r"weight_zero_points must be int8, got Int"):
        op.aten_out(w, s, z.int(), lo, hi, idx, out=torch.empty(0))
