"""patterns/float_rules.py through passes/ (FloatFusionPass, FusionPass): the float fusions'
exact graphs before and after, the semantics users expect (commutative adds, intermediates read
elsewhere, declined dtypes), numerics in eager and on the runtime, the mul / add kernels against
their patterns, and bad rules or inputs."""

import pytest
import torch
from expecttest import assert_expected_inline

import etfuse
from etfuse.passes import FloatFusionPass, FusionError, FusionPass
from etfuse.patterns import FLOAT_RULES, PatternError, Rule
from etfuse.backend_ops import ADD, ADD_RELU, MUL
from etfuse.runtime import run
from fusion_helpers import edge_program, op_names


class AddRelu(torch.nn.Module):
    """relu(x + y): the smallest fusion."""

    def forward(self, x, y):
        z = x + y
        return torch.ops.aten.relu.default(z)


class LinearRelu(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.linear = torch.nn.Linear(8, 5, bias=bias)

    def forward(self, x):
        return torch.relu(self.linear(x))


def fused_graph(model, args, **kw):
    edge = edge_program(model, args, **kw)
    fused = etfuse.fuse(edge)
    return edge, fused


def test_add_relu_graph_before_and_after():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    edge, fused = fused_graph(AddRelu(), args)
    assert_expected_inline(str(edge.exported_program().graph).strip(), """\
graph():
    %x : [num_users=1] = placeholder[target=x]
    %y : [num_users=1] = placeholder[target=y]
    %aten_add_tensor : [num_users=1] = call_function[target=executorch.exir.dialects.edge._ops.aten.add.Tensor](args = (%x, %y), kwargs = {})
    %aten_relu_default : [num_users=1] = call_function[target=executorch.exir.dialects.edge._ops.aten.relu.default](args = (%aten_add_tensor,), kwargs = {})
    return (aten_relu_default,)""")
    assert_expected_inline(str(fused.exported_program().graph).strip(), """\
graph():
    %x : [num_users=1] = placeholder[target=x]
    %y : [num_users=1] = placeholder[target=y]
    %etfuse_add_relu_default : [num_users=1] = call_function[target=executorch.exir.dialects.backend._ops.etfuse.add_relu.default](args = (%x, %y), kwargs = {})
    return (etfuse_add_relu_default,)""")


def test_add_relu_numerics_eager_and_runtime():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    _, fused = fused_graph(AddRelu(), args)
    expected = AddRelu()(*args)
    torch.testing.assert_close(fused.exported_program().module()(*args), expected)
    (out,) = run(fused.to_executorch(), args)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_runtime_method_outlives_the_program_bytes():
    # load_program(bytes) reads the .pte in place: load_method must keep the bytes alive.
    import gc

    from etfuse.runtime import load_method

    args = (torch.tensor([-2.0, 1.0, 3.0]), torch.tensor([1.0, 1.0, -5.0]))
    _, fused = fused_graph(AddRelu(), args)
    method = load_method(fused.to_executorch())
    gc.collect()
    for _ in range(3):
        torch.testing.assert_close(method.execute(args)[0], torch.tensor([0.0, 2.0, 0.0]))


def test_new_node_meta_and_provenance():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    _, fused = fused_graph(AddRelu(), args)
    (node,) = [n for n in fused.exported_program().graph.nodes if n.op == "call_function"]
    assert tuple(node.meta["val"].shape) == (3, 4)
    assert node.meta["val"].dtype == torch.float32
    assert "relu" in node.meta["stack_trace"]
    assert node.meta["etfuse"] == {"rule": "add_relu", "replaced": ["aten_add_tensor", "aten_relu_default"]}


def test_retrace_gives_the_pattern_back():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    _, fused = fused_graph(AddRelu(), args)
    retraced = fused.exported_program().run_decompositions()
    assert op_names(retraced.graph_module) == ["aten.add.Tensor", "aten.relu.default"]
    torch.testing.assert_close(retraced.module()(*args), AddRelu()(*args))


def test_reexport_keeps_the_fused_op():
    args = (torch.randn(3, 4), torch.randn(3, 4))
    _, fused = fused_graph(AddRelu(), args)
    reexported = torch.export.export(fused.exported_program().module(), args)
    assert op_names(reexported.graph_module) == ["etfuse.add_relu.default"]


def fuse_ops(model, args):
    _, fused = fused_graph(model, args)
    return op_names(fused.exported_program().graph_module), fused


def test_add_is_commutative_and_x_plus_x_fuses():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(y + x) + torch.relu(x + x)

    ops, fused = fuse_ops(M(), (torch.randn(4), torch.randn(4)))
    assert ops == ["etfuse.add_relu.default", "etfuse.add_relu.default", "aten.add.Tensor"]
    assert [n.args for n in fused.exported_program().graph.nodes if n.op == "call_function"][1][0].name == "x"


def test_intermediate_with_other_users_is_not_fused():
    class M(torch.nn.Module):
        def forward(self, x, y):
            z = x + y
            return torch.relu(z), z * 2

    ops, _ = fuse_ops(M(), (torch.randn(4), torch.randn(4)))
    assert "aten.relu.default" in ops
    assert "etfuse.add_relu.default" not in ops


def test_broadcasting_add_fuses_and_runs():
    args = (torch.randn(2, 3, 4), torch.randn(4))
    ops, fused = fuse_ops(AddRelu(), args)
    assert ops == ["etfuse.add_relu.default"]
    (out,) = run(fused.to_executorch(), args)
    torch.testing.assert_close(out, AddRelu()(*args))


def test_add_with_alpha_is_not_add_relu():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(torch.add(x, y, alpha=2))

    ops, _ = fuse_ops(M(), (torch.randn(4), torch.randn(4)))
    assert ops == ["aten.add.Tensor", "aten.relu.default"]


def test_dtype_the_kernel_lacks_is_declined_and_reported():
    args = (torch.randint(0, 5, (4,)), torch.randint(0, 5, (4,)))
    edge = edge_program(AddRelu(), args)
    p = FloatFusionPass()
    fused = edge.transform([p])
    assert op_names(fused.exported_program().graph_module) == ["aten.add.Tensor", "aten.relu.default"]
    assert [(d.rule, d.node) for d in p.report.declined] == [("add_relu", "aten_relu_default"),
                                                             ("add_rows", "aten_add_tensor")]
    assert "torch.int64" in p.report.declined[0].reason


def test_per_channel_scale_becomes_etfuse_mul(kernel_check):
    """A squeeze-excite scale ([N, C, H, W] * [N or 1, C, 1, 1], either order, channels-last
    too) and a per-feature row ([..., C] * [C], mul_rows) become etfuse::mul; a same-shape
    product stays the portable mul."""
    class M(torch.nn.Module):
        def forward(self, x, s, t, row):
            return x * s, t * x.contiguous(memory_format=torch.channels_last), x * x, x * row

    args = (torch.randn(2, 8, 5, 7), torch.randn(2, 8, 1, 1), torch.randn(1, 8, 1, 1), torch.randn(7))
    ops, fused = fuse_ops(M(), args)
    assert ops == ["etfuse.mul.default", "dim_order_ops._clone_dim_order.default", "etfuse.mul.default",
                   "aten.mul.Tensor", "etfuse.mul.default"]
    want = M()(*args)
    for got in (fused.exported_program().module()(*args), run(fused.to_executorch(), args)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    # the C++ kernels (not the functional op: its kernel is its pattern) broadcast like aten.mul
    # whatever the operands' order and layout, x[:1] sharing x's storage
    x, s = args[0], args[1]
    for a, b in ((x, s), (s, x), (x.to(memory_format=torch.channels_last), s), (x, x[:1]), (x[..., ::2], s)):
        kernel_check.eager(MUL, (a, b))
    kernel_check.runtime(MUL, [(x, s), (s, x), (kernel_check.channels_last(x), s), (x, args[3])])


def test_no_norm_rows_become_etfuse_mul_and_add(kernel_check, fused_matches_eager):
    """MobileBERT's NoNorm after a linear and a residual add: (linear(x) + r) * w + b. The
    per-feature scale and shift (either operand order) become etfuse::mul / etfuse::add; the
    same-shape residual add is the linear's residual epilogue; a shift that is not one value per
    feature of the last dim stays the portable add."""
    class NoNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 32)
            self.w, self.b = torch.nn.Parameter(torch.randn(32)), torch.nn.Parameter(torch.randn(32))

        def forward(self, x, r, col):
            y = self.b + self.w * (self.lin(x) + r)
            return y, y + col

    args = (torch.randn(1, 8, 16), torch.randn(1, 8, 32), torch.randn(8, 1))
    model = NoNorm()
    ops, fused = fuse_ops(model, args)
    assert ops == ["etfuse.linear_packed_act.default", "etfuse.mul.default", "etfuse.add.default",
                   "aten.add.Tensor"]
    (linear,) = [n for n in fused.exported_program().graph.nodes if "linear_packed_act" in str(n.target)]
    assert linear.args[7].name == "r"  # the residual
    fused_matches_eager(model, args, fused)
    # the C++ kernels: either operand order, strided rows
    x, b = torch.randn(3, 5, 6), torch.randn(6)
    for a, c in ((x, b), (b, x), (x[:, ::2], b), (x.transpose(0, 1), b)):
        kernel_check.eager(ADD, (a, c))
    kernel_check.runtime(ADD, [(x, b), (b, x)])


def test_linear_relu():
    for bias in (True, False):
        args = (torch.randn(2, 8),)  # 2 rows: PrepackWeightsPass leaves it (test_prepack.py)
        model = LinearRelu(bias)
        ops, fused = fuse_ops(model, args)
        assert ops == ["etfuse.linear_relu.default"]
        (out,) = run(fused.to_executorch(), args)
        torch.testing.assert_close(out, model(*args), rtol=1e-5, atol=1e-5)


def test_addmm_relu():
    class M(torch.nn.Module):
        def forward(self, c, a, b):
            return torch.relu(torch.addmm(c, a, b))

    args = (torch.randn(5), torch.randn(3, 7), torch.randn(7, 5))
    ops, fused = fuse_ops(M(), args)
    assert ops == ["etfuse.addmm_relu.default"]
    (out,) = run(fused.to_executorch(), args)
    torch.testing.assert_close(out, M()(*args), rtol=1e-5, atol=1e-5)


def test_fusion_inside_cond_branches():
    class M(torch.nn.Module):
        def forward(self, p, x, y):
            def yes(x, y):
                return torch.relu(x + y)

            def no(x, y):
                return torch.relu(x - y)

            return torch.cond(p.sum() > 0, yes, no, (x, y))

    x, y = torch.randn(4), torch.randn(4)
    edge = edge_program(M(), (torch.ones(1), x, y))
    p = FloatFusionPass()
    fused = edge.transform([p])
    assert [(f.rule, f.graph) for f in p.report.fused] == [("add_relu", "submodule_0")]
    gm = fused.exported_program().graph_module
    assert op_names(gm.submodule_0) == ["etfuse.add_relu.default"]
    assert op_names(gm.submodule_1) == ["aten.sub.Tensor", "aten.relu.default"]
    # to_executorch rewrites bodies in place: lowering the caller's program first must not
    # reach into the fused one (they share no graph module).
    edge.to_executorch()
    pte = fused.to_executorch()
    for pred in (torch.ones(1), -torch.ones(1)):
        (out,) = run(pte, (pred, x, y))
        torch.testing.assert_close(out, M()(pred, x, y))


def test_idempotent_and_never_returns_its_input():
    edge = edge_program(AddRelu(), (torch.randn(4), torch.randn(4)))
    gm = edge.exported_program().graph_module
    first_pass, second_pass = FloatFusionPass(), FloatFusionPass()
    first = first_pass(gm)
    second = second_pass(first.graph_module)
    assert first_pass.report.counts() == {"add_relu": 1}
    assert second_pass.report.counts() == {}  # nothing left to fuse
    assert second.graph_module.code == first.graph_module.code
    # a module of its own even when nothing fused (modified=True so executorch's pass manager takes it)
    assert second.modified
    assert second.graph_module is not first.graph_module
    assert second.graph_module.graph is not first.graph_module.graph


def test_via_executorch_backend_config():
    from executorch.exir import ExecutorchBackendConfig

    args = (torch.randn(4), torch.randn(4))
    edge = edge_program(AddRelu(), args)
    et = edge.to_executorch(ExecutorchBackendConfig(passes=[FloatFusionPass()]))
    assert "etfuse.add_relu.out" in op_names(et.exported_program().graph_module)
    (out,) = run(et, args)
    torch.testing.assert_close(out, AddRelu()(*args))


def test_failing_rule_leaves_the_callers_program_unchanged():
    def broken(m):
        raise KeyError("no such qparam")

    rule = Rule.for_op(ADD_RELU, lambda: (torch.randn(2), torch.randn(2)), constraint=broken, name="broken_add_relu")
    edge = edge_program(AddRelu(), (torch.randn(4), torch.randn(4)))
    before = str(edge.exported_program().graph)
    with pytest.raises(FusionError,
                       match="rule 'broken_add_relu' failed checking node 'aten_relu_default'.*no such qparam"):
        etfuse.fuse(edge, [FusionPass([rule])])
    assert str(edge.exported_program().graph) == before


def test_fuse_never_modifies_its_argument():
    edge = edge_program(AddRelu(), (torch.randn(4), torch.randn(4)))
    before = str(edge.exported_program().graph)
    etfuse.fuse(edge)
    etfuse.fuse(edge.exported_program())
    assert str(edge.exported_program().graph) == before


def test_fuse_rejects_what_it_cannot_fuse():
    ep = torch.export.export(AddRelu(), (torch.randn(4), torch.randn(4)))
    with pytest.raises(TypeError, match="edge-dialect program.*to_edge"):
        etfuse.fuse(ep)
    with pytest.raises(TypeError, match="got AddRelu"):
        etfuse.fuse(AddRelu())


def test_pattern_reading_a_constant_is_an_error_at_definition():
    ones = torch.ones(2)  # captured: export lifts it to a constant the pattern cannot bind
    rule = Rule("plus_one_relu", lambda self, other: torch.relu(self + other * ones), ADD_RELU,
                example_inputs=lambda: (torch.randn(2), torch.randn(2)))
    with pytest.raises(PatternError, match="plus_one_relu.*constants or parameters"):
        FusionPass([rule])


def test_pattern_losing_a_parameter_is_an_error_at_definition():
    rule = Rule("ignores_other", lambda self, other: torch.relu(self), ADD_RELU,
                example_inputs=lambda: (torch.randn(2), torch.randn(2)))
    with pytest.raises(PatternError, match=r"ignores_other.*\['other'\] vanish"):
        FusionPass([rule])


def test_rule_names_are_unique():
    with pytest.raises(ValueError, match="repeated: \\['add_relu'\\]"):
        FusionPass([FLOAT_RULES[0], FLOAT_RULES[0]])
