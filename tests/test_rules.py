"""patterns/ (Rule, patterns/trace.py, the rule table): ATen patterns become edge-dialect graphs,
scalar parameters become bindings, the table traced in one export equals each rule traced alone,
`outranks`, function replacements."""

import pytest
import torch
from expecttest import assert_expected_inline

from etfuse.backend_ops import ADD_RELU
from etfuse.patterns import PatternError, Rule
from etfuse.passes import FusionPass
from fusion_helpers import edge_program, op_names

q = torch.ops.quantized_decomposed


def clamped_add(self, other, low, high):
    # hardtanh takes its bounds as scalars: they stay literals in the edge graph.
    return torch.ops.aten.hardtanh.default(self + other, low, high)


def _rule(pattern, example_inputs, name="scaled"):
    # The replacement op is irrelevant to lowering; add_relu keeps the tests self-contained.
    return Rule(name, pattern, ADD_RELU, example_inputs, arguments=lambda m: ((m.bindings["self"], m.bindings["other"]), {}))


def test_scalar_parameters_become_placeholders():
    lowered = _rule(clamped_add, lambda: (torch.randn(4), torch.randn(4), -0.5, 6.0)).edge_pattern()
    assert_expected_inline(str(lowered.graph).strip(), """\
graph():
    %self : [num_users=1] = placeholder[target=self]
    %other : [num_users=1] = placeholder[target=other]
    %low : [num_users=1] = placeholder[target=low]
    %high : [num_users=1] = placeholder[target=high]
    %aten_add_tensor : [num_users=1] = call_function[target=executorch.exir.dialects.edge._ops.aten.add.Tensor](args = (%self, %other), kwargs = {})
    %aten_hardtanh_default : [num_users=1] = call_function[target=executorch.exir.dialects.edge._ops.aten.hardtanh.default](args = (%aten_add_tensor, %low, %high), kwargs = {})
    return (aten_hardtanh_default,)""")


def test_qparams_bind_by_name_and_must_agree():
    def dq_add(a, scale, zero_point, b):
        x = q.dequantize_per_tensor.default(a, scale, zero_point, 0, 255, torch.uint8)
        y = q.dequantize_per_tensor.default(b, scale, zero_point, 0, 255, torch.uint8)
        return torch.relu(x + y)

    seen = []
    rule = Rule("dq_add", dq_add, ADD_RELU,
                lambda: (torch.zeros(4, dtype=torch.uint8), 0.125, 3, torch.zeros(4, dtype=torch.uint8)),
                constraint=lambda m: seen.append((m.value("scale"), m.value("zero_point"))),
                arguments=lambda m: ((m.bindings["a"], m.bindings["b"]), {}))

    class Same(torch.nn.Module):
        def forward(self, a, b):
            return dq_add(a, 0.5, 7, b)

    class Different(torch.nn.Module):
        def forward(self, a, b):
            x = q.dequantize_per_tensor.default(a, 0.5, 7, 0, 255, torch.uint8)
            y = q.dequantize_per_tensor.default(b, 0.25, 7, 0, 255, torch.uint8)
            return torch.relu(x + y)

    args = (torch.zeros(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8))
    fused = edge_program(Same(), args).transform([FusionPass([rule])])
    assert op_names(fused.exported_program().graph_module) == ["etfuse.add_relu.default"]
    assert seen == [(0.5, 7)]
    unfused = edge_program(Different(), args).transform([FusionPass([rule])])
    assert "aten.relu.default" in op_names(unfused.exported_program().graph_module)


def test_scalar_parameters_need_distinct_example_values():
    with pytest.raises(PatternError, match="'low' and 'high' have the same example value 0.5"):
        _rule(clamped_add, lambda: (torch.randn(2), torch.randn(2), 0.5, 0.5)).edge_pattern()


def test_unsupported_example_input_is_named():
    with pytest.raises(PatternError, match=r"parameters \['low'\] must have tensor, int or float"):
        _rule(clamped_add, lambda: (torch.randn(2), torch.randn(2), "half", 1.0), name="bad").edge_pattern()


def _assert_cache_round_trips(traced: dict, replacements: bool) -> None:
    """Every traced graph of the table, stored in the on-disk pattern cache and read back in a
    fresh state, is the same graph (etfuse's rules all are cacheable)."""
    import os
    import tempfile
    from unittest import mock

    from etfuse.patterns import trace_cache

    with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"ETFUSE_PATTERN_CACHE": d}), \
            mock.patch.object(trace_cache, "_LOADED", {}):
        trace_cache.store(traced, replacements)
        trace_cache._LOADED.clear()  # as a new process: read from the file
        back = trace_cache.lookup(list(traced), replacements)
    assert set(back) == set(traced)
    for rule, pattern in traced.items():
        got = back[rule]
        assert str(got.graph) == str(pattern.graph), rule.name
        assert (got.params, got.anchor.name, [n.name for n in got.ops], [n.name for n in got.outputs]) == \
            (pattern.params, pattern.anchor.name, [n.name for n in pattern.ops], [n.name for n in pattern.outputs]), \
            rule.name
        assert [n.target for n in got.ops] == [n.target for n in pattern.ops], rule.name


def test_patterns_traced_together_equal_patterns_traced_alone():
    # FusionPass traces every rule of the table in one export; each pattern must be the graph
    # its own export gives, node for node.
    from etfuse.backend_ops import install
    from etfuse.patterns import RULES, trace_edge_pattern, trace_edge_patterns

    install()
    together = trace_edge_patterns(RULES)
    assert set(together) == set(RULES)
    _assert_cache_round_trips(together, replacements=False)  # before bind_literals edits them
    # Each rule alone costs an export (six minutes for the whole table): the first rule of
    # each replacement op (each namespace, each function replacement) stands for its family.
    kinds = {}
    for rule in RULES:
        kinds.setdefault((rule.key.split("::")[0], getattr(rule.replacement, "name", rule.name)), rule)
    for rule in list(kinds.values())[::4]:  # a quarter of the families (2 minutes on 2 cores for all)
        alone = rule.bind_literals(trace_edge_pattern(rule))
        batch = rule.bind_literals(together[rule])
        assert str(batch.graph) == str(alone.graph), rule.name
        assert (batch.params, batch.anchor.name, [n.name for n in batch.ops]) == \
            (alone.params, alone.anchor.name, [n.name for n in alone.ops]), rule.name


def test_replacements_traced_together_equal_replacements_traced_alone():
    from etfuse.backend_ops import install
    from etfuse.patterns import RULES, trace_edge_patterns
    from etfuse.patterns.trace import trace_replacement

    install()
    functions = [r for r in RULES if r.replacement_graph() is not None]
    together = trace_edge_patterns(functions, replacements=True)
    assert set(together) == set(functions)
    _assert_cache_round_trips(together, replacements=True)
    for rule in functions[::12]:  # a sample: each alone costs an export
        alone = rule.bind_literals(trace_replacement(rule), replacement=True)
        batch = rule.bind_literals(together[rule], replacement=True)
        assert str(batch.graph) == str(alone.graph), rule.name


def test_outranks_orders_rules_at_one_anchor():
    from etfuse.passes.engine import RuleIndex
    from etfuse.patterns import RULES

    index = RuleIndex(RULES)
    at_relu = next(e for e in index.by_anchor.values() if any(r.name == "addmm_relu" for r, _ in e))
    relu = [r.name for r, _ in at_relu]
    assert relu.index("linear_relu") < relu.index("addmm_relu")
    known = {r.name for r in RULES}
    assert all(o in known for r in RULES for o in r.outranks)


def test_outranks_beats_pattern_size():
    from etfuse.backend_ops import ADDMM_RELU, LINEAR_RELU
    from etfuse.passes import FusionPass

    def addmm_relu(self, mat1, mat2):
        return torch.relu(torch.addmm(self, mat1, mat2))

    def linear_relu(input, weight, bias):
        return torch.relu(torch.nn.functional.linear(input, weight, bias))

    small = Rule("small", addmm_relu, ADDMM_RELU, lambda: (torch.randn(16), torch.randn(4, 8), torch.randn(8, 16)),
                 outranks=("large",))
    large = Rule("large", linear_relu, LINEAR_RELU, lambda: (torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 16)

        def forward(self, x):
            return torch.relu(self.linear(x))

    args = (torch.randn(4, 8),)
    for rules, want in (([large, small], "etfuse.addmm_relu.default"),
                        ([Rule("large", linear_relu, LINEAR_RELU, large.example_inputs),
                          Rule("small", addmm_relu, ADDMM_RELU, small.example_inputs)], "etfuse.linear_relu.default")):
        fused = edge_program(M(), args).transform([FusionPass(rules)])
        assert want in op_names(fused.exported_program().graph_module)


# A rule's replacement may be any function of ops: lowered like the pattern, inlined per match.


def _scaled_relu_rule():
    # hardtanh(a - b, lo, hi) -> hardtanh(add_relu(a, -b), lo, hi) for lo >= 0: a backend op among
    # plain ops, scalar parameters bound in pattern and replacement alike.
    def pattern(a, b, lo, hi):
        return torch.ops.aten.hardtanh.default(a - b, lo, hi)

    def replacement(a, b, lo, hi):
        return torch.ops.aten.hardtanh.default(torch.ops.etfuse.add_relu.default(a, torch.neg(b)), lo, hi)

    return Rule("clamped_sub", pattern, replacement, lambda: (torch.randn(4), torch.randn(4), 0.25, 4.0),
                constraint=lambda m: None if m.value("lo") >= 0 else "lo < 0")


def test_inlined_with_bindings_and_fake_values_for_the_graphs_shapes():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.nn.functional.hardtanh(x - y, 0.0, 6.0) + 1

    args = (torch.randn(2, 3, 5), torch.randn(3, 5))  # broadcasting, shapes unlike the examples
    pass_ = FusionPass([_scaled_relu_rule()])
    fused = edge_program(M(), args).transform([pass_])
    gm = fused.exported_program().graph_module
    assert op_names(gm) == ["aten.neg.default", "etfuse.add_relu.default", "aten.hardtanh.default",
                            "dim_order_ops._to_dim_order_copy.default", "aten.add.Tensor"]
    neg, add_relu, hardtanh = [n for n in gm.graph.nodes if n.op == "call_function"][:3]
    x = next(n for n in gm.graph.find_nodes(op="placeholder") if n.name == "x")
    assert add_relu.args == (x, neg)
    assert hardtanh.args[1:] == (0.0, 6.0)  # the graph's scalars, not the examples'
    assert tuple(neg.meta["val"].shape) == (3, 5)
    assert tuple(add_relu.meta["val"].shape) == (2, 3, 5)
    assert [(f.rule, f.replaced) for f in pass_.report.fused] == [("clamped_sub", ["aten_sub_tensor",
                                                                                   "aten_hardtanh_default"])]
    torch.testing.assert_close(fused.exported_program().module()(*args), M()(*args))


def test_a_replacement_that_does_not_lower_is_named():
    def pattern(a):
        return torch.relu(a)

    def replacement(a):
        raise RuntimeError("no")

    with pytest.raises(PatternError, match="rule 'broken': its replacement does not export"):
        FusionPass([Rule("broken", pattern, replacement, lambda: (torch.randn(2),))])


def test_arguments_hook_is_for_backend_ops_only():
    with pytest.raises(PatternError, match="rule 'both'.*takes the pattern's parameters itself"):
        Rule("both", torch.relu, torch.relu, lambda: (torch.randn(2),), arguments=lambda m: ((), {}))


def test_several_outputs_with_outside_users():
    # The sum is used outside the match (before the relu, the anchor): a one-output pattern
    # cannot fuse it; a pattern returning both values can, its replacement placed before that use.
    def pattern(a, b):
        s = a + b
        return s, torch.relu(s)

    def replacement(a, b):
        return a + b, torch.ops.etfuse.add_relu.default(a, b)

    class M(torch.nn.Module):
        def forward(self, x, y):
            s = x + y
            t = s * s
            return t - torch.relu(s)

    args = (torch.randn(3, 4), torch.randn(4))
    pass_ = FusionPass([Rule("sum_and_add_relu", pattern, replacement, lambda: (torch.randn(4), torch.randn(4)))])
    fused = edge_program(M(), args).transform([pass_])
    gm = fused.exported_program().graph_module
    assert op_names(gm) == ["aten.add.Tensor", "etfuse.add_relu.default", "aten.mul.Tensor", "aten.sub.Tensor"]
    assert [f.node for f in pass_.report.fused] == ["etfuse_add_relu_default"]
    torch.testing.assert_close(fused.exported_program().module()(*args), M()(*args))


def test_outputs_must_feed_one_of_them():
    def pattern(a, b):
        return torch.relu(a), torch.sigmoid(b)

    with pytest.raises(PatternError, match="are not all inputs of one of them"):
        FusionPass([Rule("apart", pattern, pattern, lambda: (torch.randn(2), torch.randn(2)))])


def test_a_backend_op_replaces_one_output_only():
    def pattern(a, b):
        s = a + b
        return s, torch.relu(s)

    with pytest.raises(PatternError, match="returns 2 values but a BackendOp returns one"):
        FusionPass([Rule("two", pattern, ADD_RELU, lambda: (torch.randn(2), torch.randn(2)))])
