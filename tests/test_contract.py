"""What the README and the package promise where users meet etfuse: `import etfuse` is enough,
fused programs share no graph with their input, etfuse's errors arrive as themselves through
`fuse` and `transform`, loops written the natural way lower, and `fuse` is thread safe."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from executorch.exir import to_edge
from torch.export import Dim, export

import etfuse
from etfuse.backend_ops import ADD_RELU
from etfuse.passes import FusionError, FusionPass, LoopLoweringError, SymIntLoweringError, default_passes
from etfuse.patterns import Rule
from etfuse.runtime import run
from fusion_helpers import op_names


pytestmark = pytest.mark.usefixtures("runtime_kernels")


def test_import_etfuse_is_enough_for_every_documented_module():
    code = ("import etfuse, sys; assert 'executorch' not in sys.modules, 'import etfuse loaded executorch';"
            "print(len(etfuse.passes.default_passes()), etfuse.kernels.cache_root() is not None,"
            " callable(etfuse.runtime.run), etfuse.EtfuseError.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["12", "True", "True", "EtfuseError"]  # one FusionPass runs every rule


# ---- no shared graphs ------------------------------------------------------------------------

class SplitCond(torch.nn.Module):
    """Nothing here fuses: split_with_sizes_copy and a cond whose branches have no pattern."""

    def forward(self, x):
        a, b = torch.split(x, [2, 3])
        return torch.cond(a.sum() > 0, lambda a, b: (a * 2, b - 1), lambda a, b: (a - 2, b * 3), (a.exp(), b.exp()))


@pytest.mark.parametrize("first", ["fused", "input"])
def test_fused_and_input_programs_lower_in_either_order(first):
    x = torch.randn(5)
    edge = to_edge(export(SplitCond(), (x,)))
    fused = etfuse.fuse(edge)
    for name, m in fused.exported_program().graph_module.named_modules():
        assert m is not dict(edge.exported_program().graph_module.named_modules()).get(name), name
    want = SplitCond()(x)
    order = [fused, edge] if first == "fused" else [edge, fused]
    for program in order:
        got = run(program.to_executorch(), (x,))
        torch.testing.assert_close(got, list(want))
    # the fused program is still the fused edge program after its own lowering: it lowers again
    # (run_decompositions() on a program with a cond fails in torch 2.13 itself, fused or not)
    torch.testing.assert_close(run(fused.to_executorch(), (x,)), list(want))


def test_transform_with_nothing_to_fuse_returns_graphs_of_its_own():
    edge = to_edge(export(SplitCond(), (torch.randn(5),)))
    out = edge.transform(default_passes())
    assert out.exported_program() is not edge.exported_program()
    mine = {id(m) for m in out.exported_program().graph_module.modules()}
    assert not mine & {id(m) for m in edge.exported_program().graph_module.modules()}


# ---- typed errors through every route -----------------------------------------------------------

class Doubling(torch.nn.Module):
    def forward(self, x):
        return torch.while_loop(lambda x: x.sum() < 100.0, lambda x: (x * 2.0,), (x,))


def _broken_rule_pass():
    def broken(m):
        raise KeyError("no such qparam")

    return FusionPass([Rule.for_op(ADD_RELU, lambda: (torch.randn(2), torch.randn(2)), constraint=broken, name="broken")])


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


class SymShift(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]
        return x + 1, n << (n - 2)


ERRORS = {
    "loop": (LoopLoweringError, lambda: to_edge(export(Doubling(), (torch.ones(3),))), None, "no known trip-count bound"),
    "fusion": (FusionError, lambda: to_edge(export(AddRelu(), (torch.randn(4), torch.randn(4)))), _broken_rule_pass,
               "rule 'broken' failed"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
@pytest.mark.parametrize("route", ["fuse", "transform"])
def test_etfuse_errors_arrive_as_themselves(case, route):
    error, make_edge, make_passes, message = ERRORS[case]
    edge = make_edge()
    before = edge.exported_program().graph_module.code
    passes = make_passes() if make_passes else default_passes()
    passes = [passes] if not isinstance(passes, list) else passes
    with pytest.raises(error, match=message) as info:
        if route == "fuse":
            etfuse.fuse(edge, passes)
        else:
            edge.transform(passes)
    assert isinstance(info.value, etfuse.EtfuseError)
    if route == "transform":  # executorch's pass-order message is kept as the cause
        assert "An error occurred when running the" in str(info.value.__cause__)
    assert edge.exported_program().graph_module.code == before


def test_other_errors_from_transform_are_left_as_executorch_raises_them():
    def failing(gm):
        raise KeyError("not etfuse's")

    edge = to_edge(export(AddRelu(), (torch.randn(4), torch.randn(4))))
    default_passes()  # installs the unwrapping
    with pytest.raises(Exception, match="An error occurred when running the") as info:
        edge.transform([failing])
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("route", ["fuse", "transform"])
def test_symint_refusal_arrives_as_itself(route):
    from executorch.exir import EdgeCompileConfig

    ep = export(SymShift(), (torch.randn(6),), dynamic_shapes=({0: Dim("n", min=3, max=9)},))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    with pytest.raises(SymIntLoweringError, match="shift amount must be a constant"):
        etfuse.fuse(edge) if route == "fuse" else edge.transform(default_passes())


# ---- loops the way people write them ----------------------------------------------------------

class OnnxLoopAsWritten(torch.nn.Module):
    """The ONNX Loop spec's example in plain torch: M = 10, counter from `torch.tensor(0)`, cond
    `(i < M) & keep`."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form

    def forward(self, a, b, keepgoing):
        i = torch.tensor(0)
        limit = torch.tensor(10)

        def cond(i, keep, b_in):
            if self.form == "and_first":
                return (i < 10) & keep
            if self.form == "and_last":
                return keep & (i < 10)
            return (i < limit) & keep  # M as a constant tensor

        def body(i, keep, b_in):
            my_local = a + b_in
            b_out = a - b_in
            return i + 1, my_local > b_out, b_out

        return torch.while_loop(cond, body, (i, keepgoing, b))


def _reference(a: int, b: int, keep: bool):
    i, b_out = 0, b
    while i < 10 and keep:
        b_in = b_out
        my_local, b_out = a + b_in, a - b_in
        keep = my_local > b_out
        i += 1
    return i, keep, b_out


@pytest.mark.parametrize("form", ["and_first", "and_last", "tensor_limit"])
def test_onnx_loop_example_as_written_runs_on_the_runtime(form):
    args = (torch.tensor(3), torch.tensor(6), torch.tensor(True))
    edge = to_edge(export(OnnxLoopAsWritten(form), args))
    fused = etfuse.fuse(edge)
    assert "torch.ops.higher_order.while_loop" not in fused.exported_program().graph_module.code
    pte = fused.to_executorch()
    for a, b, keep in [(3, 6, True), (1, -4, True), (5, 5, False), (-2, 7, True), (0, 0, True)]:
        i, k, b_out = run(pte, (torch.tensor(a), torch.tensor(b), torch.tensor(keep)))
        assert (int(i), bool(k), int(b_out)) == _reference(a, b, keep), (a, b, keep)


class DimBoundedLoop(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]

        def cond(i, acc):
            return (i < n) & (acc.sum() < 1e9)

        def body(i, acc):
            return i + 1, torch.relu(acc + x[0])

        return torch.while_loop(cond, body, (torch.tensor(0), torch.zeros_like(x[0])))


def test_loop_bounded_by_a_dim_symint():
    ep = export(DimBoundedLoop(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim("n", min=1, max=9)},))
    pte = etfuse.fuse(to_edge(ep)).to_executorch()
    for n in (1, 4, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(run(pte, (x,)), list(DimBoundedLoop()(x)))


class ParameterLoop(torch.nn.Module):
    """Found by the fuzzer: the carry depends on a parameter (requires_grad), which made the loop's
    retrace fail in autograd ("outs_to_grad length (1) != tangents length (2)")."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return torch.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, torch.clamp(acc * 2, -1, 1)),
                                (torch.zeros((), dtype=torch.int64), y.clone()))[1]


def test_loop_whose_carry_depends_on_a_parameter():
    model, x = ParameterLoop(), torch.randn(2, 4)
    fused = etfuse.fuse(to_edge(export(model, (x,))))
    torch.testing.assert_close(run(fused.to_executorch(), (x,))[0], model(x).detach())


# ---- threads ------------------------------------------------------------------------------------

def test_fuse_from_four_threads_gives_the_single_threaded_graphs():
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x, y):
            return torch.relu(self.fc(x) + y), torch.relu(x - y)

    args = (torch.randn(2, 8), torch.randn(2, 8))
    programs = [to_edge(export(m, args)) for m in (Mlp(), AddRelu(), Mlp(), AddRelu())]
    want = [etfuse.fuse(p).exported_program().graph_module.code for p in programs]
    got, errors = {}, []

    def work(t):
        try:
            for k in range(3):
                i = (t + k) % len(programs)
                got[(t, k)] = (i, etfuse.fuse(programs[i]).exported_program().graph_module.code)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(got) == 12
    for i, code in got.values():
        assert code == want[i]


class CondThenLinear(torch.nn.Module):
    """Found by the fuzzer (wrong on the stock and, before CondViewCopyPass joined default_passes(),
    the fused runtime): a cond result read through views (a linear on 4-D input, a reshape)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda x: x + x, lambda x: x * x, (x,))
        return self.lin(y), torch.relu(y.reshape(10, 3))


def test_cond_result_read_through_views_is_right_on_the_runtime():
    model = CondThenLinear().eval()
    for sign in (1.0, -1.0):  # both branches
        x = torch.randn(1, 2, 5, 3).abs() * sign
        got = run(etfuse.fuse(to_edge(export(model, (x,)))).to_executorch(), (x,))
        for g, w in zip(got, model(x)):
            torch.testing.assert_close(g, w.detach(), rtol=1e-5, atol=1e-5)
