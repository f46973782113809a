"""Control flow on the ExecuTorch runtime: ONNX If (torch.cond), ONNX Loop (while_loop, lowered
to a bounded scan by LoopLoweringPass), OpenVINO TensorIterator (scan) and map, with etfuse
fusions inside the bodies (passes/compat, the loop and cond passes). Every program runs on the
runtime and is checked against eager PyTorch, and the operators' specification examples (ONNX
Loop and If, OpenVINO TensorIterator) against plain-Python references of their specs.
"""

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.runtime import Runtime
from functorch.experimental.control_flow import map as cf_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch.export import Dim, export

import etfuse
from etfuse.passes import (
    CondOutputCopyPass, FloatFusionPass, LoopLoweringError, LoopLoweringPass, SpecialisedShapeError, refuse_specialised,
)


@pytest.fixture(scope="module")
def kernels(runtime_kernels):
    """The runtime's etfuse kernels (the fused bodies call them)."""
    return runtime_kernels


class _Loaded:
    """A loaded method that keeps its program bytes alive (the runtime does not copy them)."""

    def __init__(self, edge):
        self.buffer = edge.to_executorch().buffer
        self.method = Runtime.get().load_program(self.buffer).load_method("forward")

    def __call__(self, *inputs):
        return list(self.method.execute(list(inputs)))


def _assert_same(got, want):
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# --- ONNX Loop: the specification's example --------------------------------------------------

M_TRIPS = 10


class OnnxLoop(torch.nn.Module):
    """The ONNX Loop spec's example: (max_trip_count=10, keepgoing) over body-net, carrying b; the scan output
    user_defined_vals is carried as a buffer written at iteration i (torch has no scan outputs
    on while_loop), so the loop returns (i, keepgoing_out, b_out, user_defined_vals buffer)."""

    def forward(self, a, b, keepgoing):
        i0 = torch.zeros((), dtype=torch.int64)
        vals0 = torch.zeros(M_TRIPS, dtype=b.dtype)

        def cond(i, keepgoing_in, b_in, vals):
            return (i < M_TRIPS) & keepgoing_in

        def body(i, keepgoing_in, b_in, vals):
            my_local = a + b_in
            b_out = a - b_in
            keepgoing_out = my_local > b_out
            user_defined_val = b_in + b_in
            vals = torch.where(torch.arange(M_TRIPS) == i, user_defined_val, vals)
            return i + 1, keepgoing_out, b_out, vals

        return while_loop(cond, body, (i0, keepgoing, b, vals0))


def onnx_loop_reference(a: int, b: int, keepgoing: bool, max_trip_count: int):
    """The C-equivalent code of the ONNX Loop spec's example, line by line."""
    keepgoing_out, b_out, user_defined_vals = keepgoing, b, []
    i = 0
    while i < max_trip_count and keepgoing_out:
        b_in = b_out
        my_local = a + b_in
        b_out = a - b_in
        keepgoing_out = my_local > b_out
        user_defined_vals.append(b_in + b_in)
        i += 1
    return i, keepgoing_out, b_out, user_defined_vals


def _int32(v):
    return torch.tensor(v, dtype=torch.int32)


@pytest.fixture(scope="module")
def onnx_loop():
    ep = export(OnnxLoop(), (_int32(3), _int32(6), torch.tensor(True)))
    lowering = LoopLoweringPass()
    edge = to_edge(ep).transform([lowering])
    return lowering, _Loaded(edge)


def test_onnx_loop_example_gives_the_c_equivalent_results(onnx_loop):
    lowering, run = onnx_loop
    assert [(r.trip_bound, r.source) for r in lowering.report] == [(10, "counter arg0_1 < 10 from 0 step 1")]
    trips, keepgoing_out, b_out, vals = run(_int32(3), _int32(6), torch.tensor(True))
    # a=3, b=6: 9 > -3 keeps going, then 0 > 6 stops: two iterations.
    assert (trips.item(), keepgoing_out.item(), b_out.item()) == (2, False, 6)
    assert vals[:2].tolist() == [12, -6] and not vals[2:].any()
    assert onnx_loop_reference(3, 6, True, M_TRIPS) == (2, False, 6, [12, -6])


@pytest.mark.parametrize("a, b, keepgoing", [(3, 6, True), (3, 6, False), (1, 2, True), (-4, 5, True), (0, 0, True)])
def test_onnx_loop_matches_eager_and_the_spec(onnx_loop, a, b, keepgoing):
    _, run = onnx_loop
    got = run(_int32(a), _int32(b), torch.tensor(keepgoing))
    _assert_same(got, OnnxLoop()(_int32(a), _int32(b), torch.tensor(keepgoing)))
    trips, keep, b_out, vals = onnx_loop_reference(a, b, keepgoing, M_TRIPS)
    assert (got[0].item(), got[1].item(), got[2].item()) == (trips, keep, b_out)
    assert got[3][:trips].tolist() == vals


class CountedLoop(torch.nn.Module):
    """for i < n (n = a Dim): acc = relu(acc + x[i]); the body's add+relu fuses."""

    def forward(self, x):
        def cond(i, acc):
            return i < x.shape[0]

        def body(i, acc):
            row = torch.index_select(x, 0, i.reshape(1)).reshape(-1)
            return i + 1, torch.relu(acc + row)

        return while_loop(cond, body, (torch.zeros((), dtype=torch.int64), torch.zeros(x.shape[1])))


def test_loop_bounded_by_dim_max_fuses_its_body_and_runs_at_every_size(kernels):
    ep = export(CountedLoop(), (torch.randn(5, 4),), dynamic_shapes=({0: Dim("n", min=1, max=12)},))
    lowering, fusion = LoopLoweringPass(), FloatFusionPass()
    edge = to_edge(ep).transform([lowering, fusion])
    assert [r.trip_bound for r in lowering.report] == [12]  # the Dim's max
    # The body now sits inside the scan step's cond branch: fusion reached the nested graph.
    assert [(f.rule, f.graph.count(".")) for f in fusion.report.fused] == [("add_relu", 1)]
    run = _Loaded(edge)
    for n in (1, 5, 12):  # trip count = n, the full bound included
        x = torch.randn(n, 4)
        _assert_same(run(x), CountedLoop()(x))


class ShapeArithmeticLoop(torch.nn.Module):
    """A loop body doing float (add+relu) and SymInt work ((n - 3) % 4, negative for n < 3)."""

    def forward(self, x):
        def cond(i, acc):
            return i < x.shape[0]

        def body(i, acc):
            row = torch.index_select(x, 0, i.reshape(1)).reshape(-1)
            return i + 1, torch.relu(acc + row) * ((x.shape[0] - 3) % 4)

        return while_loop(cond, body, (torch.zeros((), dtype=torch.int64), torch.ones(x.shape[1])))


def test_full_pipeline_in_a_loop_body_float_and_symint(kernels):
    """The passes in default-pipeline order; SymIntToPrimsPass emits no bool-returning prim, so a
    pass that retraces after it (LoopLoweringPass, executorch's SpecPropPass) cannot specialise."""
    from etfuse.passes import SymIntToPrimsPass

    ep = export(ShapeArithmeticLoop(), (torch.randn(5, 4),), dynamic_shapes=({0: Dim("n", min=1, max=9)},))
    fusion, prims = FloatFusionPass(), SymIntToPrimsPass()
    edge = to_edge(ep).transform([LoopLoweringPass(), fusion, prims])
    assert [f.rule for f in fusion.report.fused] == ["add_relu"]
    assert any(path.count(".") == 1 and count for path, count in prims.lowered.items())  # inside the body
    run = _Loaded(edge)
    for n in (1, 2, 5, 9):  # (n - 3) % 4 = 2, 3, 2, 2: Python's modulo for the negative ones
        x = torch.randn(n, 4)
        _assert_same(run(x), ShapeArithmeticLoop()(x))


class LoopInIf(torch.nn.Module):
    def forward(self, p, x):
        def looping(x):
            return while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, torch.relu(a + x)),
                              (torch.zeros((), dtype=torch.int64), x.clone()))[1]

        return torch.cond(p.sum() > 0, looping, lambda x: x - 1.0, (x,))


def test_loop_nested_in_an_if_branch(kernels):
    lowering, fusion = LoopLoweringPass(), FloatFusionPass()
    edge = to_edge(export(LoopInIf(), (torch.ones(1), torch.randn(4)))).transform([lowering, fusion])
    assert [r.trip_bound for r in lowering.report] == [3]
    assert [f.graph.count(".") for f in fusion.report.fused] == [2]  # if branch > scan step > body
    run = _Loaded(edge)
    for p in (torch.ones(1), -torch.ones(1)):
        x = torch.randn(4)
        _assert_same(run(p, x), [LoopInIf()(p, x)])


class Doubling(torch.nn.Module):
    def forward(self, x):
        return while_loop(lambda x: x.sum() < 100.0, lambda x: (x * 2.0,), (x,))


def test_loop_without_a_bound_is_refused_by_name():
    edge = to_edge(export(Doubling(), (torch.ones(3),)))
    with pytest.raises(LoopLoweringError, match=r"while_loop 'while_loop' has no known trip-count bound"):
        LoopLoweringPass()(edge.exported_program().graph_module)


def test_max_trip_count_gives_onnx_loop_semantics():
    """(M, cond): for (i = 0; i < M && cond; ++i). With M=3 the loop stops early."""
    edge = to_edge(export(Doubling(), (torch.ones(3),))).transform([LoopLoweringPass(max_trip_count=3)])
    run = _Loaded(edge)

    def reference(x, m):
        i = 0
        while i < m and x.sum() < 100.0:
            x, i = x * 2.0, i + 1
        return x

    for start in (1.0, 10.0, 40.0):  # 3 trips (capped), 2 trips, 0 trips
        x = torch.full((3,), start)
        _assert_same(run(x), [reference(x, 3)])
    assert reference(torch.ones(3), 3).tolist() != Doubling()(torch.ones(3))[0].tolist()  # M did cap it


def test_pass_does_not_modify_its_input():
    gm = to_edge(export(CountedLoop(), (torch.randn(5, 4),))).exported_program().graph_module
    before = gm.print_readable(print_output=False)
    res = LoopLoweringPass()(gm)
    assert res.modified and gm.print_readable(print_output=False) == before
    again = LoopLoweringPass()(res.graph_module)
    assert again.graph_module is not res.graph_module and again.graph_module.code == res.graph_module.code


# --- ONNX If: the specification's example ----------------------------------------------------

class OnnxIf(torch.nn.Module):
    """The If operator's example: then_branch outputs x = [1,2,3,4,5], else_branch y = [5,4,3,2,1]."""

    def forward(self, cond):
        x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
        y = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
        return torch.cond(cond, lambda x, y: x.clone(), lambda x, y: y.clone(), (x, y))


def test_onnx_if_example_picks_the_branch_of_the_predicate():
    run = _Loaded(to_edge(export(OnnxIf(), (torch.tensor(True),))))
    assert run(torch.tensor(True))[0].tolist() == [1, 2, 3, 4, 5]
    assert run(torch.tensor(False))[0].tolist() == [5, 4, 3, 2, 1]


class FusedIf(torch.nn.Module):
    def forward(self, p, x, y):
        return torch.cond(p.sum() > 0, lambda x, y: torch.relu(x + y), lambda x, y: torch.relu(x - y) + torch.relu(y + x), (x, y))


def test_fusion_in_both_if_branches_runs_for_each_predicate(kernels):
    fusion = FloatFusionPass()
    edge = to_edge(export(FusedIf(), (torch.ones(1), torch.randn(8), torch.randn(8)))).transform([fusion])
    assert sorted(f.graph for f in fusion.report.fused) == ["submodule_0", "submodule_1"]
    run = _Loaded(edge)
    for p in (torch.ones(1), -torch.ones(1)):
        x, y = torch.randn(8), torch.randn(8)
        _assert_same(run(p, x, y), FusedIf()(p, x, y))


class TwoIfsAndAScan(torch.nn.Module):
    def forward(self, p, a, xs):
        first = torch.cond(p.sum() > 0, lambda a, b: a + b, lambda a, b: a - b, (a, xs[0]))
        second = torch.cond(p.sum() > 0, lambda a, b: a * b, lambda a, b: a / b, (a, xs[1]))
        return first + second, first, *scan(lambda h, x: (h * x, (h * x).clone()), a, xs)


def test_an_if_result_survives_later_control_flow():
    """executorch runs every body in one shared arena and a cond's result points into it: the
    next cond or scan overwrites it (stock lowering returns wrong values: tests/test_compat.py)."""
    ep = export(TwoIfsAndAScan(), (torch.ones(1), torch.randn(8), torch.randn(3, 8)))
    copies = CondOutputCopyPass()  # the stock bug itself: tests/test_compat.py
    edge = to_edge(ep)
    before = edge.exported_program().graph_module.code
    fixed_edge = edge.transform([copies])
    assert copies.copied == [("", "getitem")]  # `second` dies before the scan: no copy
    assert edge.exported_program().graph_module.code == before  # the caller's program is untouched
    again = CondOutputCopyPass()
    again(fixed_edge.exported_program().graph_module)
    assert again.copied == []
    fixed = _Loaded(fixed_edge)
    for p in (torch.ones(1), -torch.ones(1)):
        a, xs = torch.randn(8), torch.randn(3, 8)
        want = TwoIfsAndAScan()(p, a, xs)
        _assert_same(fixed(p, a, xs), want)


# --- OpenVINO TensorIterator: the specification's examples -----------------------------------

B, T, IN, H = 1, 25, 512, 256  # TensorIterator's example 2: X [1, 25, 512], h/c [1, 256], W [1024, 768]


def lstm_cell(x, h, c, w, b):
    """OpenVINO LSTMCell (gates f, i, c, o), x [B, IN], h/c [B, H], w [4H, IN+H], b [4H]."""
    gates = torch.nn.functional.linear(torch.cat([x, h], dim=1), w, b)
    f, i, g, o = gates.chunk(4, dim=1)
    c_out = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_out = torch.sigmoid(o) * torch.tanh(c_out)
    return h_out, c_out


def tensor_iterator_reference(x, h0, c0, w, b, axis, start, end, stride):
    """The TensorIterator spec, plainly: slice input port 0 along `axis` from `start` to `end`
    (negative = counted from the end, on slice boundaries: -1 is the end of the axis) by
    `stride`, run the body per slice with back edges h -> h, c -> c, and concatenate the body's
    h result along `axis`, in reverse order for a negative stride."""
    length = x.shape[axis]
    s = start + length + 1 if start < 0 else start
    e = end + length + 1 if end < 0 else end
    part = abs(stride)
    n_iter = abs(e - s) // part
    h, c, results = h0, c0, []
    for k in range(n_iter):
        lo = s + k * stride if stride > 0 else s - (k + 1) * part
        piece = x.narrow(axis, lo, part).reshape(x.shape[0], -1)  # Reshape [1, 1, IN] -> [1, IN]
        h, c = lstm_cell(piece, h, c, w, b)  # back edges: Result h -> Parameter h, c -> c
        results.append(h.reshape(h.shape[0], 1, -1))  # Reshape [1, H] -> [1, 1, H]
    ordered = results if stride > 0 else results[::-1]
    return torch.cat(ordered, dim=axis), h, c


class LstmIterator(torch.nn.Module):
    """Two TensorIterators as torch `scan`s over the same cell: forward (start=0, end=-1,
    stride=1) and reversed (start=-1, end=0, stride=-1). The sliced axis 1 is scan's dim 0, the
    back edges are the carry, the concatenated output is scan's stacked ys (flipped back for the
    negative stride)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        # Buffers, like the example's Const layers (a scan reading parameters that require grad
        # costs executorch ~1 s per retrace of the body: scan_autograd partitions a joint graph).
        self.register_buffer("w", torch.randn(4 * H, IN + H, generator=g) * (IN + H) ** -0.5)
        self.register_buffer("b", torch.randn(4 * H, generator=g) * 0.1)

    def _iterate(self, x, h0, c0, reverse):
        xs = x.movedim(1, 0)  # axis 1 -> iteration axis
        if reverse:
            xs = xs.flip(0)

        def body(carry, x_t):
            h, c = carry
            h, c = lstm_cell(x_t, h, c, self.w, self.b)
            return (h, c.clone()), h.clone()

        (h, c), ys = scan(body, (h0, c0), xs)
        if reverse:
            ys = ys.flip(0)
        return ys.movedim(0, 1), h, c

    def forward(self, x, h0, c0):
        return *self._iterate(x, h0, c0, reverse=False), *self._iterate(x, h0, c0, reverse=True)


def test_tensor_iterator_lstm_matches_the_spec():
    model = LstmIterator()
    x, h0, c0 = torch.randn(B, T, IN), torch.randn(B, H), torch.randn(B, H)
    run = _Loaded(to_edge(export(model, (x, h0, c0))))
    w, b = model.w, model.b
    for _ in range(2):
        x, h0, c0 = torch.randn(B, T, IN), torch.randn(B, H), torch.randn(B, H)
        want = [*tensor_iterator_reference(x, h0, c0, w, b, axis=1, start=0, end=-1, stride=1),
                *tensor_iterator_reference(x, h0, c0, w, b, axis=1, start=-1, end=0, stride=-1)]
        assert not torch.allclose(want[0], want[3])  # the two directions differ
        _assert_same(run(x, h0, c0), want)
        _assert_same(model(x, h0, c0), want)


class FusedScan(torch.nn.Module):
    def forward(self, h0, xs):
        def body(h, x):
            h = torch.relu(h + x)
            return h, h.clone()

        return scan(body, h0, xs)


def test_fusion_in_scan_body_with_dynamic_length(kernels):
    ep = export(FusedScan(), (torch.randn(4), torch.randn(5, 4)), dynamic_shapes=(None, {0: Dim("t", min=1, max=16)}))
    fusion = FloatFusionPass()
    edge = to_edge(ep).transform([fusion])
    assert [(f.rule, f.graph) for f in fusion.report.fused] == [("add_relu", "submodule_0")]
    run = _Loaded(edge)
    for t in (1, 5, 16):
        h0, xs = torch.randn(4), torch.randn(t, 4)
        _assert_same(run(h0, xs), FusedScan()(h0, xs))


# --- map over a dynamic dimension ------------------------------------------------------------

class MapRelu(torch.nn.Module):
    def forward(self, xs, y):
        return cf_map(lambda x, y: torch.relu(x + y), xs, y) * xs.shape[0]


def _map_program():
    return export(MapRelu(), (torch.randn(4, 3), torch.randn(3)), dynamic_shapes=({0: Dim("n", min=2, max=16)}, None))


def test_etfuse_refuses_a_program_stock_to_edge_specialised():
    edge = to_edge(_map_program())  # the stock bug itself: tests/test_compat.py
    with pytest.raises(SpecialisedShapeError, match=r"specialised during lowering \(4: VR\[4, 4\]\)"):
        refuse_specialised(edge.exported_program())


def test_map_stays_dynamic_fuses_and_runs_at_every_size(kernels):
    fusion = FloatFusionPass()
    edge = etfuse.to_edge(_map_program()).transform([fusion])
    assert [str(r) for r in edge.exported_program().range_constraints.values()] == ["VR[2, 16]"]
    refuse_specialised(edge.exported_program())  # nothing to refuse
    assert [f.rule for f in fusion.report.fused] == ["add_relu"]
    run = _Loaded(edge)
    for n in (2, 4, 7, 16):
        xs, y = torch.randn(n, 3), torch.randn(3)
        _assert_same(run(xs, y), MapRelu()(xs, y))


def test_a_specialised_program_is_refused_not_lowered():
    ep = _map_program()
    to_edge(ep)  # stock lowering specialises n in the program's own shape environment
    with pytest.raises(SpecialisedShapeError, match=r"specialised the dynamic dimension\(s\) \['s\d+'\]"):
        etfuse.to_edge(ep)


# --- quantized fusion inside bodies ---------------------------------------------------------

def _qadd_relu(a, b):
    qd = torch.ops.quantized_decomposed
    fa = qd.dequantize_per_tensor.default(a, 0.05, 3, -128, 127, torch.int8)
    fb = qd.dequantize_per_tensor.default(b, 0.05, 3, -128, 127, torch.int8)
    return qd.quantize_per_tensor.default(torch.relu(fa + fb), 0.05, 3, -128, 127, torch.int8)


class QuantizedIfAndScan(torch.nn.Module):
    def forward(self, p, a, xs):
        picked = torch.cond(p.sum() > 0, _qadd_relu, lambda a, b: a.clone(), (a, xs[0]))

        def body(h, x):
            h = _qadd_relu(h, x)
            return h, h.clone()

        return picked, *scan(body, a, xs)


def test_quantized_fusion_in_if_branch_and_scan_body(kernels):
    quant_fusion = pytest.importorskip("etfuse.passes.quant_fusion")
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401

    def q8(*shape):
        return torch.randint(-128, 128, shape, dtype=torch.int8)

    fusion = quant_fusion.QuantFusionPass()
    edge = to_edge(export(QuantizedIfAndScan(), (torch.ones(1), q8(8), q8(3, 8)))).transform(
        [fusion, CondOutputCopyPass()])  # the If's result must survive the scan
    assert sorted((f.rule, f.graph) for f in fusion.report.fused) == [
        ("add_relu", "submodule_0"), ("add_relu", "submodule_2")]  # the If branch, the scan body
    run = _Loaded(edge)
    for p in (torch.ones(1), -torch.ones(1)):
        a, xs = q8(8), q8(3, 8)
        got, want = run(p, a, xs), QuantizedIfAndScan()(p, a, xs)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), [(g - w).abs().max().item() if g.shape == w.shape else (g.shape, w.shape) for g, w in zip(got, want)]
