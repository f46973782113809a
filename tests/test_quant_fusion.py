"""Quantized fusions (patterns/quant_rules.py, patterns/embedding_rules.py, passes/quant_fusion.py)
on graphs from the real quantization flows, run on the ExecuTorch runtime.

Flows: PT2E with executorch's XNNPACK quantizer (int8, signed), FX `prepare_fx` +
`_convert_to_reference_decomposed_fx` (uint8, one dequantize shared by its users), torchao
`quantize_` (IntxWeightOnlyConfig, `dequantize_affine`) for embeddings, and hand-written
dequantize -> op -> quantize models for the scalar forms and the refusals.
"""

import copy
import functools
import types

import pytest
import torch
import torch.fx as fx
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from expecttest import assert_expected_inline

import etfuse.kernels
from etfuse.backend_ops import runtime_op
from etfuse.backend_ops.quantized_ops import (
    DEQUANTIZE_PER_TENSOR, EMBEDDING_BYTE, QUANTIZE_PER_TENSOR, QUANTIZED_ADD, QUANTIZED_ADD_RELU,
    QUANTIZED_ADD_SCALAR, decompositions,
)
from etfuse.passes import QuantFusionPass
from etfuse.runtime import run
from fusion_helpers import op_names

qd = torch.ops.quantized_decomposed
# the etfuse twins of the quantized ops: their `.out` kernels are etfuse's (backend_ops/runtime_names.py)
etq = torch.ops.etfuse
I8, U8 = torch.int8, torch.uint8
RANGES = {I8: (-128, 127), U8: (0, 255)}


def graph_text(gm: fx.GraphModule) -> str:
    """One line per op: `name(args)`, floats to 4 significant digits (calibration noise aside,
    the graph's structure is what the expectations pin down)."""

    def fmt(a):
        if isinstance(a, fx.Node):
            return a.name
        if isinstance(a, float):
            return f"{a:.4g}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in a) + "]"
        if isinstance(a, torch.dtype):
            return str(a).replace("torch.", "")
        return repr(a)

    lines = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            t = n.target._op if isinstance(n.target, EdgeOpOverload) else n.target
            name = str(t).replace("quantized_decomposed.", "qd.").replace("aten.", "")
            args = ", ".join([fmt(a) for a in n.args] + [f"{k}={fmt(v)}" for k, v in n.kwargs.items()])
            lines.append(f"{n.name} = {name}({args})")
        elif n.op == "output":
            lines.append(f"return {fmt(n.args[0])}")
    return "\n".join(lines)


def fuse(edge):
    p = QuantFusionPass()
    return edge.transform([p]), p.report


def run_both(edge, fused, inputs):
    """Outputs of the unfused and the fused program on the ExecuTorch runtime. (executorch's
    to_executorch rewrites the program it lowers in place: lower copies, the tests reuse them.)"""
    return run(copy.deepcopy(edge).to_executorch(), inputs), run(copy.deepcopy(fused).to_executorch(), inputs)


# What needs executorch's stock quantized kernels loaded *before* etfuse runs in one subprocess,
# once per test session (in this process etfuse is imported first, and its `install()` imports
# them after itself):
# 1. executorch's QuantFusionPass binds its uint8-only patterns before etfuse is imported;
# 2. the stock kernels are loaded first, then etfuse's: both register (no name is shared), and a
#    fused int8 program with add_relu runs on etfuse's kernels beside them;
# 3. the unfused embedding programs run on the stock runtime (only it has dequantize_per_channel.out).
_STOCK_PROCESS = r"""
import os, sys, warnings, torch
result = {}
import executorch.kernels.quantized  # the real stock library, before etfuse
from executorch.exir.passes._quant_patterns_and_replacements import get_quant_patterns_and_replacements
get_quant_patterns_and_replacements({})  # binds executorch's uint8-only patterns as the ops' kernels
import etfuse, etfuse.backend_ops, etfuse.backend_ops.quantized_ops as q
etfuse.backend_ops.install()
a = torch.randint(-128, 127, (64,), dtype=torch.int8)
args = (a, 0.1, 3, -128, 127, a.flip(0), 0.2, -4, -128, 127, 0.3, 1, -128, 127)
result["patterns_first"] = all(torch.equal(op.aten(*args), op.pattern(*args))
                               for op in (q.QUANTIZED_ADD, q.QUANTIZED_ADD_RELU))
import etfuse.kernels
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    info = etfuse.kernels.load()
from executorch.extension.pybindings import portable_lib
names = set(portable_lib._get_operator_names())
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import test_quant_fusion as t
from etfuse.runtime import run
cal = t.calibration((4, 8), (8,))
edge = t.pt2e_int8(t.AddModel(), cal[0], cal)
fused = etfuse.fuse(edge)
et = fused.to_executorch()
result["stock_first"] = {
    "etfuse_runtime_loaded": info.runtime_library is not None,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],  # etfuse's kind
    "both_registered": {"quantized_decomposed::add.out", "etfuse::quantized_decomposed_add.out",
                        "etfuse::quantized_decomposed_add_relu.out"} <= names,
    "fused_ops": t.op_names(et.exported_program().graph_module),
    "fused_vs_unfused": [(f, u) for f, u in zip(run(et, cal[1]), t.run(t.copy.deepcopy(edge).to_executorch(), cal[1]))],
}
from executorch.runtime import Runtime
outs = []
for dt, zp in t.STOCK_EMBEDDING_CASES:
    edge, inputs = t.per_channel_edge(dt, zp)
    outs.append(list(Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute(inputs)))
result["per_channel"] = outs
torch.save(result, sys.argv[2])
"""

STOCK_EMBEDDING_CASES = [("int8", True), ("int8", False), ("uint8", True), ("uint8", False)]


@functools.lru_cache(maxsize=None)
def stock_process() -> dict:
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        dst = f"{d}/out.pt"
        proc = subprocess.run([sys.executable, "-c", _STOCK_PROCESS, __file__, dst], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"stock-kernel subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return torch.load(dst)


def per_channel_edge(dt_name, zero_points):
    """dequantize_per_channel(weight buffer, per-row scales[, zero points]) -> embedding."""
    dt = getattr(torch, dt_name)
    g = torch.Generator().manual_seed(7)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            lo, hi = RANGES[dt]
            self.register_buffer("w", torch.randint(lo, hi, (20, 8), dtype=dt, generator=g))
            self.register_buffer("s", torch.rand(20, generator=g) * 0.1 + 0.01)
            self.register_buffer("z", torch.randint(-4, 4, (20,), generator=g) + (128 if dt == U8 else 0))

        def forward(self, i):
            z = self.z if zero_points else None
            w = qd.dequantize_per_channel.default(self.w, self.s, z, 0, *RANGES[dt], dt)
            return torch.nn.functional.embedding(i, w)

    idx = torch.tensor([[0, 19, 5], [7, 7, 1]])
    return to_edge(torch.export.export(M(), (idx,))), (idx,)


def pt2e_int8(model, example_inputs, calibration):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    m = torch.export.export(model.eval(), example_inputs).module()
    m = prepare_pt2e(m, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    for args in calibration:
        m(*args)
    m = convert_pt2e(m)
    return to_edge(torch.export.export(m, example_inputs))


def fx_uint8(model, example_inputs, calibration):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.backend_config.executorch import get_executorch_backend_config
    from torch.ao.quantization.quantize_fx import _convert_to_reference_decomposed_fx, prepare_fx

    m = prepare_fx(model.eval(), get_default_qconfig_mapping("qnnpack"), example_inputs,
                   backend_config=get_executorch_backend_config())
    for args in calibration:
        m(*args)
    m = _convert_to_reference_decomposed_fx(m)
    return to_edge(torch.export.export(m, example_inputs, strict=True),
                   compile_config=EdgeCompileConfig(_check_ir_validity=False))


class AddModel(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y), x + y, x + x


def calibration(*shapes, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, generator=g) * 2 for s in shapes) for _ in range(n)]


# the eager `.out` kernels (errors named by the C++ kernels) and the runtime's
pytestmark = pytest.mark.usefixtures("eager_kernels")


@pytest.fixture(scope="module")
def pt2e():
    """AddModel through PT2E (XNNPACK quantizer, int8), calibrated, fused."""
    torch.manual_seed(0)
    shapes = ((4, 8), (8,))  # y broadcasts along x's rows
    cal = calibration(*shapes)
    edge = pt2e_int8(AddModel(), cal[0], cal)
    fused, report = fuse(edge)
    return types.SimpleNamespace(shapes=shapes, cal=cal, edge=edge, fused=fused, report=report)


def test_pt2e_int8_fused_graph(pt2e):
    assert pt2e.report.counts() == {"add_relu": 1, "add": 2}
    assert pt2e.report.declined == []
    assert_expected_inline(graph_text(pt2e.fused.exported_program().graph_module), """\
quantized_decomposed_quantize_per_tensor_default = qd.quantize_per_tensor.default(x, 0.04722, -17, -128, 127, int8)
quantized_decomposed_quantize_per_tensor_default_1 = qd.quantize_per_tensor.default(y, 0.02536, 12, -128, 127, int8)
quantized_decomposed_add_relu_default = qd.add_relu.default(quantized_decomposed_quantize_per_tensor_default, 0.04722, -17, -128, 127, quantized_decomposed_quantize_per_tensor_default_1, 0.02536, 12, -128, 127, 0.02385, -128, -128, 127)
quantized_decomposed_dequantize_per_tensor_default_5 = qd.dequantize_per_tensor.default(quantized_decomposed_add_relu_default, 0.02385, -128, -128, 127, int8)
quantized_decomposed_add_default = qd.add.default(quantized_decomposed_quantize_per_tensor_default, 0.04722, -17, -128, 127, quantized_decomposed_quantize_per_tensor_default_1, 0.02536, 12, -128, 127, 0.05269, 12, -128, 127)
quantized_decomposed_dequantize_per_tensor_default_6 = qd.dequantize_per_tensor.default(quantized_decomposed_add_default, 0.05269, 12, -128, 127, int8)
quantized_decomposed_add_default_1 = qd.add.default(quantized_decomposed_quantize_per_tensor_default, 0.04722, -17, -128, 127, quantized_decomposed_quantize_per_tensor_default, 0.04722, -17, -128, 127, 0.09445, -17, -128, 127)
quantized_decomposed_dequantize_per_tensor_default_7 = qd.dequantize_per_tensor.default(quantized_decomposed_add_default_1, 0.09445, -17, -128, 127, int8)
return [quantized_decomposed_dequantize_per_tensor_default_5, quantized_decomposed_dequantize_per_tensor_default_6, quantized_decomposed_dequantize_per_tensor_default_7]""")


def test_pt2e_int8_runtime_equals_unfused_runtime(pt2e):
    # Bit-equal: the kernels compute exactly the decomposed float32 steps.
    for inputs in calibration(*pt2e.shapes, n=3, seed=1):
        inputs = tuple(t * 3 for t in inputs)  # also saturates
        unfused, fused = run_both(pt2e.edge, pt2e.fused, inputs)
        for u, f in zip(unfused, fused):
            torch.testing.assert_close(f, u, rtol=0, atol=0)


def test_pt2e_int8_with_float_fusion_after_it(pt2e):
    # QuantFusionPass must run before FloatFusionPass, which would otherwise turn
    # relu(add(dq, dq)) into a float etfuse::add_relu and leave the quantize behind.
    import etfuse
    from etfuse.passes import FloatFusionPass

    fused = etfuse.fuse(pt2e.edge, passes=[QuantFusionPass(), FloatFusionPass()])
    ops = op_names(fused.exported_program().graph_module)
    assert ops.count("quantized_decomposed.add_relu.default") == 1
    assert "etfuse.add_relu.default" not in ops
    wrong_order = etfuse.fuse(pt2e.edge, passes=[FloatFusionPass(), QuantFusionPass()])
    assert "etfuse.add_relu.default" in op_names(wrong_order.exported_program().graph_module)


def test_pt2e_int8_in_executorch_backend_config(pt2e):
    from executorch.exir import ExecutorchBackendConfig

    # (to_executorch with config passes rewrites the program it is given: use a copy)
    et = copy.deepcopy(pt2e.edge).to_executorch(ExecutorchBackendConfig(passes=[QuantFusionPass()]))
    ops = op_names(et.exported_program().graph_module)
    # executorch's own lowering: the fused ops lower to etfuse's kernels
    # (backend_ops/executorch_overrides.py), the program's quantize/dequantize to the stock ones
    assert "etfuse.quantized_decomposed_add_relu.out" in ops
    assert ops.count("etfuse.quantized_decomposed_add.out") == 2
    assert "quantized_decomposed.quantize_per_tensor.out" in ops
    inputs = pt2e.cal[2]
    for u, f in zip(run(copy.deepcopy(pt2e.edge).to_executorch(), inputs), run(et, inputs)):
        torch.testing.assert_close(f, u, rtol=0, atol=0)


def test_pt2e_int8_new_nodes_have_meta_val(pt2e):
    for n in pt2e.fused.exported_program().graph.nodes:
        if n.op == "call_function":
            assert isinstance(n.meta["val"], torch.Tensor), n.name


def test_pt2e_int8_caller_program_unchanged(pt2e):
    assert "quantized_decomposed.add.default" not in op_names(pt2e.edge.exported_program().graph_module)


def test_pt2e_int8_retrace_gives_the_pattern_back(pt2e):
    retraced = pt2e.fused.exported_program().run_decompositions()
    ops = op_names(retraced.graph_module)
    assert "quantized_decomposed.add.default" not in ops
    assert "quantized_decomposed.add_relu.default" not in ops
    assert ops.count("aten.add.Tensor") == 3
    assert ops.count("aten.relu.default") == 1
    inputs = pt2e.cal[1]
    for r, u in zip(retraced.module()(*inputs), pt2e.edge.exported_program().module()(*inputs)):
        torch.testing.assert_close(r, u, rtol=0, atol=0)


@pytest.fixture(scope="module")
def fx_u8():
    """AddModel in the FX reference form (uint8), which shares one dequantize among its users:
    the pass splits it."""
    cal = calibration((2, 5), (2, 5))
    edge = fx_uint8(AddModel(), cal[0], cal)
    fused, report = fuse(edge)
    return types.SimpleNamespace(cal=cal, edge=edge, fused=fused, report=report)


def test_fx_uint8_fused_graph(fx_u8):
    assert fx_u8.report.counts() == {"add_relu": 1, "add": 2}
    assert op_names(fx_u8.fused.exported_program().graph_module) == [
        "quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.default",
        "quantized_decomposed.add_relu.default", "quantized_decomposed.dequantize_per_tensor.default",
        "quantized_decomposed.add.default", "quantized_decomposed.dequantize_per_tensor.default",
        "quantized_decomposed.add.default", "quantized_decomposed.dequantize_per_tensor.default",
    ]
    add = [n for n in fx_u8.fused.exported_program().graph.nodes if "add_default" in n.name][0]
    assert (add.args[3], add.args[4]) == (0, 255)


def test_fx_uint8_runtime_equals_unfused_runtime(fx_u8):
    for inputs in calibration((2, 5), (2, 5), n=3, seed=2):
        unfused, fused = run_both(fx_u8.edge, fx_u8.fused, inputs)
        for u, f in zip(unfused, fused):
            torch.testing.assert_close(f, u, rtol=0, atol=0)


def test_fx_uint8_caller_graph_keeps_its_shared_dequantize(fx_u8):
    dqs = [n for n in fx_u8.edge.exported_program().graph.nodes if "dequantize" in n.name]
    assert any(len(n.users) > 1 for n in dqs)


def _dq(x, s, z, dt):
    return qd.dequantize_per_tensor.default(x, s, z, *RANGES[dt], dt)


def _q(x, s, z, dt):
    return qd.quantize_per_tensor.default(x, s, z, *RANGES[dt], dt)


class ScalarAdd(torch.nn.Module):
    def __init__(self, dt, form):
        super().__init__()
        self.dt, self.form = dt, form

    def forward(self, qx):
        x = _dq(qx, 0.05, 3, self.dt)
        if self.form == "literal":
            y = torch.ops.aten.add.Scalar(x, 0.37)  # stays a literal in the edge graph
        elif self.form == "float":
            y = x + 0.37  # to_edge lifts 0.37 to a constant tensor
        else:
            y = 2 + x  # lifted int64 constant, cast to float32; operands swapped
        return _q(y, 0.04, -2 if self.dt == I8 else 120, self.dt)


def _check_scalar_add(dt, form, expected_rule):
    qx = torch.randint(*RANGES[dt], (3, 6), dtype=dt)
    edge = to_edge(torch.export.export(ScalarAdd(dt, form), (qx,)))
    fused, report = fuse(edge)
    assert report.counts() == {expected_rule: 1}
    assert op_names(fused.exported_program().graph_module) == ["quantized_decomposed.add.scalar"]
    node = next(n for n in fused.exported_program().graph.nodes if n.op == "call_function")
    unfused_out, fused_out = run_both(edge, fused, (qx,))
    torch.testing.assert_close(fused_out[0], unfused_out[0], rtol=0, atol=0)
    return node


def test_scalar_add_literal():
    for dt in (I8, U8):
        node = _check_scalar_add(dt, "literal", "add_scalar")
        assert node.args[6] == 0.37


def test_scalar_add_lifted_float_constant():
    for dt in (I8, U8):
        node = _check_scalar_add(dt, "float", "add_scalar_lifted")
        assert round(node.args[6] - 0.37, 6) == 0  # the lifted float32 value


def test_scalar_add_lifted_int_constant():
    node = _check_scalar_add(I8, "int", "add_scalar_lifted_int")
    assert node.args[6] == 2


def test_scalar_add_graph():
    qx = torch.randint(-128, 127, (3, 6), dtype=I8)
    fused, _ = fuse(to_edge(torch.export.export(ScalarAdd(I8, "float"), (qx,))))
    assert_expected_inline(graph_text(fused.exported_program().graph_module), """\
quantized_decomposed_add_scalar = qd.add.scalar(qx, 0.05, 3, -128, 127, int8, 0.37, 0.04, -2, -128, 127, int8)
return [quantized_decomposed_add_scalar]""")


def test_scalar_add_retrace():
    qx = torch.randint(-128, 127, (3, 6), dtype=I8)
    edge = to_edge(torch.export.export(ScalarAdd(I8, "literal"), (qx,)))
    fused, _ = fuse(edge)
    retraced = fused.exported_program().run_decompositions()
    assert op_names(retraced.graph_module) == [
        "quantized_decomposed.dequantize_per_tensor.default", "aten.add.Scalar",
        "quantized_decomposed.quantize_per_tensor.default"]
    torch.testing.assert_close(retraced.module()(qx), ScalarAdd(I8, "literal")(qx), rtol=0, atol=0)


class Mixed(torch.nn.Module):
    def __init__(self, a=(0.05, 3, I8), b=(0.1, -1, I8), out=(0.2, 0, I8), ranges=None):
        super().__init__()
        self.a, self.b, self.out, self.ranges = a, b, out, ranges or {}

    def forward(self, qa, qb):
        def dq(x, p, k):
            return qd.dequantize_per_tensor.default(x, p[0], p[1], *self.ranges.get(k, RANGES[p[2]]), p[2])

        y = dq(qa, self.a, "a") + dq(qb, self.b, "b")
        return qd.quantize_per_tensor.default(y, self.out[0], self.out[1], *self.ranges.get("out", RANGES[self.out[2]]),
                                              self.out[2])


def _declined(model, qa, qb):
    edge = to_edge(torch.export.export(model, (qa, qb)))
    fused, report = fuse(edge)
    assert report.fused == []
    assert "aten.add.Tensor" in op_names(fused.exported_program().graph_module)
    # (the lifted-scalar rules also look at dq + dq and decline: the second operand is no constant)
    return [d.reason for d in report.declined if d.rule == "add"]


def test_mismatched_dtypes():
    qa, qb = torch.zeros(4, dtype=I8), torch.zeros(4, dtype=U8)
    reasons = _declined(Mixed(b=(0.1, 5, U8)), qa, qb)
    assert reasons == ["dtypes differ: a_dtype=torch.int8, b_dtype=torch.uint8, out_dtype=torch.int8; "
                       "the kernels take one dtype"]


def test_zero_point_outside_quant_range():
    qa = torch.zeros(4, dtype=I8)
    reasons = _declined(Mixed(out=(0.2, 100, I8), ranges={"out": (-10, 10)}), qa, qa)
    assert reasons == ["out_zero_point 100 is outside the quant range [-10, 10]"]


def test_quant_range_outside_dtype():
    # uint8 data described with a signed range: the stock add.out aborts on this.
    qa = torch.zeros(4, dtype=I8)
    reasons = _declined(Mixed(ranges={"a": (-128, 200)}), qa, qa)
    assert reasons == ["a quant range [-128, 200] is not inside torch.int8's [-128, 127]"]


def test_per_channel_is_not_per_tensor_add():
    class M(torch.nn.Module):
        def forward(self, qa, qb):
            x = qd.dequantize_per_channel.default(qa, torch.ones(2), torch.zeros(2, dtype=torch.long), 0, -128, 127, I8)
            return _q(x + _dq(qb, 0.1, 0, I8), 0.2, 0, I8)

    qa = torch.zeros(2, 3, dtype=I8)
    edge = to_edge(torch.export.export(M(), (qa, qa)))
    fused, report = fuse(edge)
    assert report.fused == []


def test_broadcast_fuses_and_matches():
    qa = torch.randint(-128, 127, (2, 3, 4), dtype=I8)
    qb = torch.randint(-128, 127, (3, 1), dtype=I8)
    edge = to_edge(torch.export.export(Mixed(), (qa, qb)))
    fused, report = fuse(edge)
    assert report.counts() == {"add": 1}
    unfused_out, fused_out = run_both(edge, fused, (qa, qb))
    torch.testing.assert_close(fused_out[0], unfused_out[0], rtol=0, atol=0)


def test_bad_qparams_at_runtime_are_errors_not_aborts():
    qa = torch.randint(-128, 127, (4,), dtype=I8)
    edge = to_edge(torch.export.export(Mixed(), (qa, qa)))
    fused, _ = fuse(edge)
    node = next(n for n in fused.exported_program().graph.nodes if n.op == "call_function")
    node.args = (node.args[0], -1.0, *node.args[2:])  # a_scale < 0, written into the program
    with pytest.raises(RuntimeError):
        run(fused.to_executorch(), (qa, qa))
    # eager kernel: a RuntimeError naming the problem
    with pytest.raises(RuntimeError, match="a_scale must be finite and > 0"):
        etq.quantized_decomposed_add.out(qa, -1.0, 0, -128, 127, qa, 0.1, 0, -128, 127, 0.1, 0, -128, 127, out=torch.empty(4, dtype=I8))
    with pytest.raises(RuntimeError, match="zero_point 300 is outside"):
        etq.quantized_decomposed_add_relu.out(qa, 0.1, 300, -128, 127, qa, 0.1, 0, -128, 127, 0.1, 0, -128, 127,
                        out=torch.empty(4, dtype=I8))


class MixedRelu(Mixed):
    def forward(self, qa, qb):
        y = torch.relu(qd.dequantize_per_tensor.default(qa, *self.a[:2], *RANGES[self.a[2]], self.a[2])
                       + qd.dequantize_per_tensor.default(qb, *self.b[:2], *RANGES[self.b[2]], self.b[2]))
        return qd.quantize_per_tensor.default(y, self.out[0], self.out[1], *RANGES[self.out[2]], self.out[2])


# qparams are checked in float32, the precision the kernels compute in. out_scale=1e-45 is
# a fine double, but 1/scale is inf in float32: 0 * inf = NaN, converted to int8 (undefined)
# gave -128 where the unfused program gives 0.


def test_eager_kernels_name_the_op_and_parameter():
    qa, o = torch.zeros(4, dtype=I8), torch.empty(4, dtype=I8)
    tail = (0, -128, 127)
    for op, name in ((etq.quantized_decomposed_add.out, "add.out"), (etq.quantized_decomposed_add_relu.out, "add_relu.out")):
        with pytest.raises(RuntimeError, match=rf"quantized_decomposed::{name}: out_scale 1e-45 is too small: "
                                               r"1/scale = 1e\+45 overflows float32"):
            op(qa, 0.1, *tail, qa, 0.1, *tail, 1e-45, *tail, out=o)
        with pytest.raises(RuntimeError, match=rf"{name}: b_scale 1e\+37 is too large: \(q - zero_point\) \* scale "
                                               "overflows float32"):
            op(qa, 0.1, *tail, qa, 1e37, *tail, 0.1, *tail, out=o)
        with pytest.raises(RuntimeError, match=rf"{name}: a_scale 1e\+39 is not a finite float32 > 0"):
            op(qa, 1e39, *tail, qa, 0.1, *tail, 0.1, *tail, out=o)
        with pytest.raises(RuntimeError, match=rf"{name}: a_scale 1e-46 is not a finite float32 > 0"):
            op(qa, 1e-46, *tail, qa, 0.1, *tail, 0.1, *tail, out=o)
    with pytest.raises(RuntimeError, match="quantize_per_tensor.out: input_scale 1e-45 is too small"):
        etq.quantized_decomposed_quantize_per_tensor.out(torch.zeros(4), 1e-45, 0, -128, 127, I8, out=o)
    with pytest.raises(RuntimeError, match=r"add.scalar_out: out_scale 1e-45 is too small"):
        etq.quantized_decomposed_add.scalar_out(qa, 0.1, 0, -128, 127, I8, 1.0, 1e-45, 0, -128, 127, I8, out=o)
    with pytest.raises(RuntimeError, match=r"add.scalar_out: b is NaN"):
        etq.quantized_decomposed_add.scalar_out(qa, 0.1, 0, -128, 127, I8, float("nan"), 0.1, 0, -128, 127, I8, out=o)
    # the smallest scale whose reciprocal is a finite float32 still works
    etq.quantized_decomposed_add_relu.out(qa, 0.1, *tail, qa, 0.1, *tail, 3e-39, *tail, out=o)
    assert o.tolist() == [0, 0, 0, 0]


def test_runtime_kernel_fails_the_method_instead_of_minus_128():
    qa = torch.zeros(8, dtype=I8)
    edge = to_edge(torch.export.export(MixedRelu(a=(0.05, 0, I8), b=(0.1, 0, I8)), (qa, qa)))
    fused, report = fuse(edge)
    assert report.counts() == {"add_relu": 1}
    node = next(n for n in fused.exported_program().graph.nodes
                if n.op == "call_function" and "add_relu" in str(n.target))
    assert node.args[10] == 0.2  # out_scale
    assert run(copy.deepcopy(fused).to_executorch(), (qa, qa))[0].tolist() == [0] * 8
    node.args = (*node.args[:10], 1e-45, *node.args[11:])  # written into the program
    with pytest.raises(RuntimeError):
        run(fused.to_executorch(), (qa, qa))


def test_fusion_declines_scales_the_kernels_reject():
    qa = torch.zeros(4, dtype=I8)
    edge = to_edge(torch.export.export(MixedRelu(out=(1e-45, 0, I8)), (qa, qa)))
    fused, report = fuse(edge)
    assert report.fused == []
    reasons = [d.reason for d in report.declined if d.rule == "add_relu"]
    assert ("out_scale is 1e-45; the kernels compute in float32, where scale, 1/scale or (q - zp) * scale "
                  "is not finite" in reasons)


def _torchao_edge(dtype):
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.quant_primitives import MappingType

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 16)

        def forward(self, i):
            return self.emb(i)

    torch.manual_seed(0)
    m = M().to(dtype).eval()
    quantize_(m, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0),
                                      mapping_type=MappingType.ASYMMETRIC),
              lambda mod, fqn: isinstance(mod, torch.nn.Embedding))
    idx = torch.randint(0, 32, (3, 5))
    return to_edge(torch.export.export(m, (idx,))), idx


def test_torchao_dequantize_affine():
    # float32 gives the functional op, float16 (torchao passes output_dtype) the .dtype variant,
    # as executorch's rules do (patterns/embedding_rules.py)
    for dtype, rule, op in ((torch.float32, "embedding_byte_affine", "embedding_byte.default"),
                            (torch.float16, "embedding_byte_affine_dtype", "embedding_byte.dtype")):
        edge, idx = _torchao_edge(dtype)
        fused, report = fuse(edge)
        assert report.counts() == {rule: 1}, report.declined
        assert op_names(fused.exported_program().graph_module) == [f"quantized_decomposed.{op}"]
        # No runtime here has torchao::dequantize_affine.out (executorch ships no kernel for it),
        # so the unfused program runs in eager, op for op as lowered.
        (fused_out,) = run(fused.to_executorch(), (idx,))
        assert fused_out.dtype == dtype
        torch.testing.assert_close(fused_out, edge.exported_program().module()(idx), rtol=0, atol=0)


def test_torchao_graph():
    edge, _ = _torchao_edge(torch.float32)
    fused, _ = fuse(edge)
    assert_expected_inline(graph_text(fused.exported_program().graph_module), """\
quantized_decomposed_embedding_byte_default = qd.embedding_byte.default(p_emb_parametrizations_weight_original0, p_emb_parametrizations_weight_original1, p_emb_parametrizations_weight_original2, -128, 127, i)
return [quantized_decomposed_embedding_byte_default]""")


def test_dequantize_per_channel_with_and_without_zero_points():
    fused_outs = []
    for dt, zp in STOCK_EMBEDDING_CASES:  # zero points: a tensor or None, one rule
        edge, inputs = per_channel_edge(dt, zp)
        fused, report = fuse(edge)
        assert report.counts() == {"embedding_byte": 1}
        fused_outs.append(run(fused.to_executorch(), inputs)[0])
    for f, (u,) in zip(fused_outs, stock_process()["per_channel"]):
        torch.testing.assert_close(f, u, rtol=0, atol=0)


def test_retrace_with_decompositions():
    edge, (idx,) = per_channel_edge("int8", True)
    fused, _ = fuse(edge)
    retraced = fused.exported_program().run_decompositions(decompositions())
    ops = op_names(retraced.graph_module)
    assert "quantized_decomposed.embedding_byte.default" not in ops
    assert "aten.embedding.default" in ops
    torch.testing.assert_close(retraced.module()(idx), edge.exported_program().module()(idx), rtol=0, atol=0)


def test_opcheck(opcheck):
    a = torch.randint(-128, 127, (3, 4), dtype=I8)
    b = torch.randint(-128, 127, (4,), dtype=I8)
    binary = (a, 0.1, 3, -128, 127, b, 0.2, -4, -128, 127, 0.3, 1, -128, 127)
    scalar = (a, 0.1, 3, -128, 127, I8, 0.5, 0.3, 1, -128, 127, I8)
    w, s = torch.randint(0, 255, (10, 6), dtype=U8), torch.rand(10)
    emb = (w, s, torch.randint(0, 9, (10,)).float(), 0, 255, torch.tensor([1, 9]))
    for op, args, out in [(QUANTIZED_ADD, binary, torch.empty(3, 4, dtype=I8)),
                          (QUANTIZED_ADD_RELU, binary, torch.empty(3, 4, dtype=I8)),
                          (QUANTIZED_ADD_SCALAR, scalar, torch.empty(3, 4, dtype=I8)),
                          (EMBEDDING_BYTE, emb, torch.empty(2, 6))]:
        opcheck(op.aten, args)
        opcheck(runtime_op(op).aten, args)
        opcheck.out(runtime_op(op).aten_out, args, out)
    opcheck.out(runtime_op(QUANTIZE_PER_TENSOR).aten_out, (torch.randn(5), 0.1, 2, -128, 127, I8),
                torch.empty(5, dtype=I8))
    opcheck.out(runtime_op(DEQUANTIZE_PER_TENSOR).aten_out, (a, 0.1, 2, -128, 127, I8), torch.empty(3, 4))


def test_out_schemas():
    assert str(runtime_op(QUANTIZED_ADD_SCALAR).aten_out._schema) == (
        "etfuse::quantized_decomposed_add.scalar_out(Tensor qa, float a_scale, int a_zero_point, int a_quant_min, "
        "int a_quant_max, ScalarType a_dtype, Scalar b, float out_scale, int out_zero_point, int out_quant_min, "
        "int out_quant_max, ScalarType out_dtype, *, Tensor(a!) out) -> Tensor(a!)")
    assert str(runtime_op(QUANTIZED_ADD_RELU).aten_out._schema).endswith(
        "int out_quant_max, *, Tensor(a!) out) -> Tensor(a!)")


def test_executorch_patterns_bound_first():
    # executorch's QuantFusionPass binds uint8-only patterns as the ops' kernels; if that
    # happens before etfuse is imported, etfuse's int8-capable pattern must still win.
    assert stock_process()["patterns_first"]


def test_stock_kernels_loaded_first_live_beside_etfuse():
    r = stock_process()["stock_first"]
    assert (r["etfuse_runtime_loaded"], r["both_registered"], r["warnings"]) == (True, True, [])
    # the .pte calls etfuse's names for what etfuse fused and for the edges' quantize/dequantize
    assert "etfuse.quantized_decomposed_add_relu.out" in r["fused_ops"]
    assert r["fused_ops"].count("etfuse.quantized_decomposed_add.out") == 2
    assert not [o for o in r["fused_ops"] if o.startswith("quantized_decomposed.")], r["fused_ops"]
    for f, u in r["fused_vs_unfused"]:
        torch.testing.assert_close(f, u, rtol=0, atol=0)


def test_stock_kernels_imported_after_etfuse():
    # etfuse.backend_ops.install() imported the real stock library after its own ops; both
    # libraries' kernels are in the runtime, under different names.
    import sys

    from executorch.extension.pybindings import portable_lib

    assert hasattr(sys.modules["executorch.kernels.quantized"], "__file__")
    names = set(portable_lib._get_operator_names())
    assert {"quantized_decomposed::add.out", "quantized_decomposed::embedding_byte.out",
            "etfuse::quantized_decomposed_add.out",
            "etfuse::quantized_decomposed_embedding_byte.out"} <= names
