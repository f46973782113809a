"""SymIntToPrimsPass: shape arithmetic of dynamic-shape programs -> exact executorch_prim ops.

Every model here is exported with a `Dim` range whose sizes make the operands negative, zero
and positive (a = n - 9), lowered to a .pte and run on the ExecuTorch runtime at several sizes;
each scalar output must equal eager PyTorch exactly, with the same Python type.
"""

import math
import operator

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.runtime import Runtime
from expecttest import assert_expected_inline
from torch.export import Dim, export

import etfuse
from etfuse.backend_ops.prims import PRIMS
from etfuse.passes import SymIntLoweringError, SymIntToPrimsPass

N = Dim("n", min=2, max=40)
SIZES = (2, 4, 5, 8, 9, 12, 17, 40)  # a = n - 9 runs from -7 through 0 to 31


def _export(module, n=5):
    return export(module, (torch.randn(n),), dynamic_shapes=({0: N},))


def _load(edge):
    # The runtime reads the program from the buffer without copying it: keep the bytes alive.
    buffer = edge.to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    method._etfuse_buffer = buffer
    return method


def _run(edge, sizes=SIZES):
    method = _load(edge)
    return {n: list(method.execute([torch.randn(n)])) for n in sizes}


def _assert_matches_eager(module, results):
    for n, got in results.items():
        want = list(module(torch.randn(n)))
        for i, (g, w) in enumerate(zip(got, want)):
            if isinstance(w, torch.Tensor):
                continue
            assert type(g) is type(w) and g == w, f"n={n} output {i}: runtime {g!r}, eager {w!r}"


def _graph(gm):
    """One line per call: `name = target(args)`, targets shortened."""
    def short(t):
        s = getattr(t, "__name__", str(t))
        return s.replace("executorch_prim.", "prim.").replace("aten.", "")
    lines = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            args = ", ".join(a.name if isinstance(a, torch.fx.Node) else repr(a) for a in n.args)
            lines.append(f"{n.name} = {short(n.target)}({args})")
    return "\n".join(lines)


class EveryBuiltin(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]
        a = n - 9
        f = a / 2
        return (
            x + 1,  # a tensor output (the runtime needs one)
            a + 3, a - n, a * 3, -a, a / 3, a // 4, a % 4, n % 3,
            a == 3, a > 0, a < 0, a >= 1, a <= -1, a != 3,
            abs(a), a ** 3, a ** 0, (n > 3) & (n < 9), (n > 12) | (n < 5),
            a & 6, a | 5, a & -3, a << 2, a >> 1,
            math.floor(f), math.ceil(f), math.trunc(f), round(f), round(a / 4),
            torch.sym_max(a, 2), torch.sym_min(a, 2), torch.sym_not(n > 7),
            torch.sym_ite(n > 7, a, n * 2), torch.sym_int(f), torch.sym_float(a),
        )


def test_every_builtin_matches_eager_on_the_runtime():
    edge = etfuse.to_edge(_export(EveryBuiltin()))
    gm = edge.exported_program().graph_module
    left = {n.target for n in gm.graph.nodes if n.op == "call_function"
            and not hasattr(n.target, "_schema") and n.target is not operator.getitem}
    # Only the comparisons stay Python builtins; executorch maps them onto its prims later.
    assert left <= {operator.eq, operator.gt, operator.lt, operator.ge, operator.le}
    _assert_matches_eager(EveryBuiltin(), _run(edge))


class ShapesFromBuiltins(torch.nn.Module):
    """Tensor shapes computed through builtins (those whose guards torch.export can solve when
    they become sizes; the others are covered as values by EveryBuiltin)."""

    def forward(self, x):
        n = x.shape[0]
        a = n - 9
        sizes = [n >> 1, math.floor(a / 3) + 4, math.ceil(n / 3), n - torch.sym_min(n, 2), math.trunc(a / 2) + 5,
                 n << 1, -a + 40, torch.sym_ite(a != 0, 2, 3), torch.sym_ite(torch.sym_not(n > 7), 2, 3),
                 torch.sym_int(n / 3) + 1, math.floor(torch.sym_float(n) / 2.5) + 1]
        return tuple(x.new_ones(s) * i for i, s in enumerate(sizes))


def test_shapes_through_builtins_match_eager_on_the_runtime():
    method = _load(etfuse.to_edge(export(ShapesFromBuiltins(), (torch.randn(12),),
                                             dynamic_shapes=({0: Dim("n", min=4, max=40)},))))
    for n in (4, 7, 9, 12, 40):
        x = torch.randn(n)
        got, want = method.execute([x]), ShapesFromBuiltins()(x)
        for g, w in zip(got, want):
            assert torch.equal(g, w), f"n={n}: runtime shape {tuple(g.shape)}, eager {tuple(w.shape)}"


def test_graph_after():
    class M(torch.nn.Module):
        def forward(self, x):
            a = x.shape[0] - 9
            return x + 1, a % 4, a != 3, math.floor(a / 2), torch.sym_max(a, 2)

    edge = etfuse.to_edge(_export(M()))
    assert_expected_inline(_graph(edge.exported_program().graph_module), """\
sym_size = sym_size.int(x, 0)
executorch_prim_sub_scalar = prim.sub.Scalar(sym_size, 9)
dim_order_ops__to_dim_order_copy_default = dim_order_ops._to_dim_order_copy.default(_lifted_tensor_constant0)
aten_add_tensor = add.Tensor(x, dim_order_ops__to_dim_order_copy_default)
executorch_prim_floordiv_scalar = prim.floordiv.Scalar(executorch_prim_sub_scalar, 4)
executorch_prim_mul_scalar = prim.mul.Scalar(executorch_prim_floordiv_scalar, 4)
executorch_prim_sub_scalar_1 = prim.sub.Scalar(executorch_prim_sub_scalar, executorch_prim_mul_scalar)
eq = eq(executorch_prim_sub_scalar, 3)
executorch_prim_sym_ite_scalar = prim.sym_ite.Scalar(eq, False, True)
executorch_prim_truediv_scalar = prim.truediv.Scalar(executorch_prim_sub_scalar, 2)
executorch_prim_neg_scalar = prim.neg.Scalar(executorch_prim_truediv_scalar)
executorch_prim_ceil_scalar = prim.ceil.Scalar(executorch_prim_neg_scalar)
executorch_prim_neg_scalar_1 = prim.neg.Scalar(executorch_prim_ceil_scalar)
executorch_prim_sym_max_scalar = prim.sym_max.Scalar(executorch_prim_sub_scalar, 2)""")


def test_modulo_is_exact_where_the_runtime_kernel_is_not():
    """The runtime's mod.Scalar is C's `%`: stock lowering gives -7 % 4 == -3; Python says 1."""
    class M(torch.nn.Module):
        def forward(self, x):
            a = x.shape[0] - 9
            return x + 1, a % 4, a // 4, round(a / 2)

    stock = _run(to_edge(_export(M())), sizes=(2,))
    assert stock[2][1:] == [-3, -2, -4]  # -7 % 4 wrong; -7 // 4 and round(-3.5) right
    ours = _run(etfuse.to_edge(_export(M())), sizes=(2, 3, 4, 9, 14))
    assert ours[2][1:] == [1, -2, -4]
    _assert_matches_eager(M(), ours)


class DataScalars(torch.nn.Module):
    """Unbacked SymInts (`.item()`) take any sign: both operands negative, mixed, zero."""

    def forward(self, t, x):
        a, b = t[0].item(), t[1].item()
        return (x + 1, a % b, a // b, abs(a), round(a / b), a != b, torch.sym_max(a, b), torch.sym_min(a, b),
                (a & 5) | 8, a >> 2, a << 3, math.floor(a / 4), math.ceil(a / 4), math.trunc(a / 4), a ** 3)


def test_negative_operands_of_every_sign_match_python():
    method = _load(etfuse.to_edge(export(DataScalars(), (torch.tensor([7, 3]), torch.randn(2)))))
    pairs = [(a, b) for a in (-9, -7, -5, -1, 0, 1, 5, 7, 13) for b in (-4, -3, -2, 1, 2, 3, 6)]
    for a, b in pairs:
        t, x = torch.tensor([a, b]), torch.randn(2)
        got, want = list(method.execute([t, x]))[1:], list(DataScalars()(t, x))[1:]
        assert got == want and [type(g) for g in got] == [type(w) for w in want], (a, b, got, want)


def test_symbolic_arithmetic_inside_cond_branches():
    class M(torch.nn.Module):
        def forward(self, x):
            def big(x):
                return x * ((x.shape[0] - 13) % 4) + round((x.shape[0] - 9) / 2)

            def small(x):
                return x * (abs(x.shape[0] - 9) // 3) - torch.sym_max(x.shape[0] - 7, 0)

            return (torch.cond(x.shape[0] > 8, big, small, (x,)),)

    ep = export(M(), (torch.randn(10),), dynamic_shapes=({0: Dim("n", min=4, max=40)},))
    p = SymIntToPrimsPass()
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).transform([p])
    assert len(set(p.lowered) - {""}) == 2  # both branch bodies
    method = _load(edge)
    for n in (4, 7, 9, 10, 23, 40):  # both branches, several sizes
        x = torch.randn(n)
        torch.testing.assert_close(method.execute([x])[0], M()(x)[0])


@pytest.mark.parametrize("expr, why", [
    (lambda n: n << (n - 2), "shift amount must be a constant"),
    (lambda n: n & (n - 1), "one operand must be a constant"),
    (lambda n: 2 ** n, "exponent must be a constant"),
    (lambda n: (n / 3) % 1.5, "float modulo"),
    (lambda n: (n / 3) ** 2, "only a constant int exponent"),
])
def test_refuses_what_it_cannot_lower_exactly(expr, why):
    class M(torch.nn.Module):
        def forward(self, x):
            return x + 1, expr(x.shape[0])

    edge = to_edge(_export(M()), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    with pytest.raises(SymIntLoweringError, match=why) as e:
        SymIntToPrimsPass()(edge.exported_program().graph_module)
    assert "in graph <top>" in str(e.value)


def test_pass_never_mutates_its_input_and_is_idempotent():
    ep = to_edge(_export(EveryBuiltin()), compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    before = ep.graph_module.code
    res = SymIntToPrimsPass()(ep.graph_module)
    assert res.modified and ep.graph_module.code == before
    lowering = SymIntToPrimsPass()
    again = lowering(res.graph_module)
    assert lowering.lowered == {} and again.graph_module.code == res.graph_module.code


def test_prims_retrace_without_specialising():
    """The prims' patterns are symbolic builtins: a lowered program retraces to the same
    arithmetic, keeps its Dim range and computes the same values at every size."""
    edge = etfuse.to_edge(_export(EveryBuiltin()))
    retraced = edge.exported_program().run_decompositions()
    assert not any(str(n.target).startswith("executorch_prim") for n in retraced.graph.nodes)
    assert [str(r) for r in retraced.range_constraints.values()] == ["VR[2, 40]"]
    for n in (2, 9, 31):
        x = torch.randn(n)
        got, want = retraced.module()(x), EveryBuiltin()(x)
        assert all(isinstance(w, torch.Tensor) or (g == w and type(g) is type(w)) for g, w in zip(got, want))


def test_every_runtime_prim_is_in_the_table():
    from executorch.extension.pybindings import portable_lib

    runtime = {n for n in portable_lib._get_operator_names() if n.startswith("executorch_prim::")}
    assert {p.qualname for p in PRIMS.values()} <= runtime
