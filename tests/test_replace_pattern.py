"""`etfuse.passes.replace_pattern` against `torch.fx.subgraph_rewriter.replace_pattern_with_filters`:
both run on copies of the same graph and must give the same graph (the printed code: ops,
arguments, node names, order) and the same `ReplacedPatterns` (anchor, nodes map, replacement
node names). Graphs: hand-written corner cases, random graphs from the fuzz generator (torch
only rewrites the top graph; each control-flow body is compared with torch run on that body
alone), and edge graphs from PT2E and FX quantization with the patterns executorch uses.
"""

from __future__ import annotations

import copy
import random
from typing import Optional

import pytest
import torch
import torch.fx as fx
from torch.fx import subgraph_rewriter
from torch.fx.passes.utils.matcher_utils import InternalMatch

from etfuse.passes import graph_modules, replace_pattern, replace_patterns
from fuzz_models import FuzzModel, RandomDraw, example_inputs, generate

aten = torch.ops.aten


def summary(replaced) -> list:
    def name(v):
        return v.name if isinstance(v, fx.Node) else v

    return [(r.anchor.name, [(k.name, name(v)) for k, v in r.nodes_map.items()], [name(n) for n in r.replacements])
            for r in replaced]


def assert_same_as_torch(gm: fx.GraphModule, pattern, replacement, filters=None, ignore_literals=False,
                         per_graph: Optional[dict] = None) -> list:
    """Run both on copies of `gm`; each graph module (the top one and every body) must come out
    the same as torch's rewriter run on that graph module alone. Returns etfuse's replacements
    (and fills `per_graph`, if given: graph module path -> replacements there)."""
    ours = copy.deepcopy(gm)
    got = replace_pattern(ours, pattern, replacement, filters, ignore_literals)
    want = []
    ours_by_name = dict(graph_modules(ours))
    for name, m in graph_modules(gm):
        theirs = copy.deepcopy(m)
        try:
            here = subgraph_rewriter.replace_pattern_with_filters(theirs, pattern, replacement, filters, ignore_literals)
            want += here
            if per_graph is not None:
                per_graph[name] = len(here)
        except KeyError:
            # torch fails when one anchor of a multi-output pattern has no candidate and the
            # others match; nothing can match there, and etfuse finds nothing
            theirs = m
        assert ours_by_name[name].code == theirs.code, f"graph {name or '<top>'} differs"
    assert summary(got) == summary(want)
    return got


def traced(fn) -> fx.GraphModule:
    return fx.symbolic_trace(fn)


# --- hand-written corner cases --------------------------------------------------------------------


def relu2(x):
    return torch.relu(torch.relu(x))


def test_overlapping_chain_keeps_the_first_match_torch_finds():
    gm = traced(lambda x: torch.relu(torch.relu(torch.relu(x))))
    got = assert_same_as_torch(gm, relu2, lambda x: torch.sigmoid(x))
    assert len(got) == 1
    gm = traced(lambda x: torch.relu(torch.relu(torch.relu(torch.relu(torch.relu(x))))))
    assert len(assert_same_as_torch(gm, relu2, lambda x: torch.sigmoid(x))) == 2


def test_pattern_that_is_the_whole_graph():
    def f(x, y):
        return torch.relu(x + y) * y

    got = assert_same_as_torch(traced(f), f, lambda x, y: torch.sub(x, y))
    assert len(got) == 1


def test_pattern_output_with_outside_users_is_replaced():
    def f(x, y):
        a = torch.relu(x + y)
        return a * 2, a - 1

    assert len(assert_same_as_torch(traced(f), lambda x, y: torch.relu(x + y), lambda x, y: torch.sigmoid(x - y))) == 1


def test_interior_node_with_outside_users_is_not_matched():
    def f(x, y):
        a = x + y
        return torch.relu(a), a

    assert assert_same_as_torch(traced(f), lambda x, y: torch.relu(x + y), lambda x, y: x) == []


def test_literals_compared_by_type_and_value_unless_ignored():
    def f(x):
        return torch.add(x, 2) + torch.add(x, 2.0) + torch.add(x, 3) + torch.clamp(x, 0.0, 6.0)

    for ignore in (False, True):
        got = assert_same_as_torch(traced(f), lambda x: torch.add(x, 2), lambda x: torch.sub(x, 2), ignore_literals=ignore)
        assert len(got) == (3 if ignore else 1)
        got = assert_same_as_torch(traced(f), lambda x: torch.clamp(x, 0.0, 1.0), lambda x: torch.relu(x),
                                   ignore_literals=ignore)
        assert len(got) == (1 if ignore else 0)


def test_x_plus_x():
    def f(x, y):
        return (x + x) * (x + y) + (y + y)

    assert len(assert_same_as_torch(traced(f), lambda x: x + x, lambda x: x * 2)) == 2
    # two placeholders never bind one graph node: `a + b` misses `x + x`
    assert len(assert_same_as_torch(traced(f), lambda a, b: a + b, lambda a, b: a - b)) == 2


def test_multi_output_patterns():
    def f(x):
        a, b = torch.relu(x), torch.sigmoid(x)
        m = x * 2
        c, d = torch.relu(m), torch.sigmoid(m)
        return a + b, c * d, a

    def two_anchors(x):
        return torch.relu(x), torch.sigmoid(x)

    got = assert_same_as_torch(traced(f), two_anchors, lambda x: (torch.tanh(x), torch.exp(x)))
    assert len(got) == 2

    def returned_and_used_inside(x, y):  # one anchor; `a` is returned and used by it
        a = torch.relu(x)
        return a, a + y

    def g(x, y):
        a = torch.relu(x)
        return a * 3, a + y

    assert len(assert_same_as_torch(traced(g), returned_and_used_inside, lambda x, y: (torch.tanh(x), x - y))) == 1


def test_a_match_whose_fusion_would_form_a_cycle_is_dropped():
    def connected(x, y):
        a = torch.relu(x)
        return a, a + y

    def g(x):
        r = torch.relu(x)
        return r + r * 2  # r -> mul -> add: fusing {relu, add} would need mul inside it

    assert assert_same_as_torch(traced(g), connected, lambda x, y: (x, x)) == []

    def disconnected(x, y):
        return torch.relu(x), torch.sigmoid(y)

    def h(x):
        r = torch.relu(x)
        return torch.sigmoid(r * 2), torch.sigmoid(x + 1)  # the first sigmoid forms a cycle, the second not

    got = assert_same_as_torch(traced(h), disconnected, lambda x, y: (torch.tanh(x), torch.exp(y)))
    assert len(got) == 1


def test_filters_see_internal_matches_after_overlaps_are_dropped():
    seen = []

    def not_the_first(match, graph, pattern_graph):
        assert isinstance(match, InternalMatch) and isinstance(graph, fx.Graph) and isinstance(pattern_graph, fx.Graph)
        assert match.anchors[0].graph is pattern_graph and match.returning_nodes[0].graph is graph
        seen.append(match.returning_nodes[0].name)
        return match.returning_nodes[0].name != "relu_1"

    gm = traced(lambda x: torch.relu(torch.relu(torch.relu(torch.relu(torch.relu(x))))))
    got = assert_same_as_torch(gm, relu2, lambda x: torch.sigmoid(x), [not_the_first])
    # relu_2(relu_1) overlapped the first match, which the filter then refused: it stays unmatched
    assert seen == ["relu_1", "relu_3"] * 2 and summary(got)[0][1][0] == ("relu_1", "relu_3")


def test_pattern_and_replacement_as_graphs_and_graph_modules():
    def f(x, y):
        return torch.relu(x + y) + torch.relu(y + x)

    pattern, replacement = traced(lambda a, b: torch.relu(a + b)), traced(lambda a, b: torch.sigmoid(b - a))
    assert len(assert_same_as_torch(traced(f), pattern, replacement)) == 2
    assert len(assert_same_as_torch(traced(f), pattern.graph, replacement.graph)) == 2


class AddConstant(torch.nn.Module):
    def __init__(self, name: str, relu: bool):
        super().__init__()
        self.register_buffer(name, torch.ones(3))
        self.name, self.relu = name, relu

    def forward(self, x):
        y = x + getattr(self, self.name)
        return torch.relu(y) if self.relu else y


def test_constant_attributes_match_any_tensor_attribute():
    gm = fx.symbolic_trace(AddConstant("weight", relu=True))
    pattern = fx.symbolic_trace(AddConstant("c", relu=False))
    assert len(assert_same_as_torch(gm, pattern, lambda x: torch.sigmoid(x))) == 1


def test_replace_patterns_equals_one_call_per_entry():
    def f(x, y):
        return torch.relu(torch.relu(x + y)) * (x + x)

    entries = [(lambda x: x + x, lambda x: x * 2, None), (relu2, lambda x: torch.sigmoid(x), []),
               (lambda a, b: a + b, lambda a, b: a - b, None)]
    one_by_one, together = traced(f), traced(f)
    want = [replace_pattern(one_by_one, p, r, flt) for p, r, flt in entries]
    got = replace_patterns(together, entries)
    assert together.code == one_by_one.code
    assert [summary(x) for x in got] == [summary(x) for x in want]


def test_the_recompile_is_deferred_but_never_missed():
    """The module's code is regenerated on first use (call, `code`, `str`), not in the call;
    whatever the caller does next sees the rewritten graph, as after torch's eager recompile."""
    def f(x, y):
        return torch.relu(x + y) * 2

    x, y = torch.randn(5), torch.randn(5)
    called, printed, pickled = traced(f), traced(f), traced(f)
    for gm in (called, printed, pickled):
        replace_pattern(gm, lambda a: torch.relu(a), lambda a: torch.sigmoid(a))
        assert "forward" not in type(gm).__dict__ or type(gm).forward.__name__ == "_lazy_forward"
    torch.testing.assert_close(called(x, y), torch.sigmoid(x + y) * 2)  # first call recompiles
    torch.testing.assert_close(called(x, y), torch.sigmoid(x + y) * 2)
    assert "sigmoid" in printed.code and "relu" not in printed.code
    assert "sigmoid" in str(printed)
    restored = copy.deepcopy(pickled)
    torch.testing.assert_close(restored(x, y), torch.sigmoid(x + y) * 2)
    import pickle
    torch.testing.assert_close(pickle.loads(pickle.dumps(pickled))(x, y), torch.sigmoid(x + y) * 2)
    # a later edit and an explicit recompile by the caller work as before
    node = next(n for n in called.graph.nodes if n.target is torch.sigmoid)
    node.target = torch.tanh
    called.recompile()
    torch.testing.assert_close(called(x, y), torch.tanh(x + y) * 2)
    # other modules (even of the same traced function) are untouched
    assert "forward" in type(traced(f)).__dict__


# --- control flow --------------------------------------------------------------------------------


class InCond(torch.nn.Module):
    def forward(self, p, x, y):
        def then(x, y):
            return torch.relu(x + y)

        def other(x, y):
            return torch.relu(x - y) + torch.relu(x + y)

        return torch.cond(p.sum() > 0, then, other, (x, y)) + torch.relu(x + y)


def add_relu(a, b):
    return aten.relu.default(aten.add.Tensor(a, b))


def add_relu_replacement(a, b):
    return aten.clamp.default(aten.add.Tensor(b, a), 0.0)


def cond_program():
    args = (torch.ones(1), torch.randn(3), torch.randn(3))
    return torch.export.export(InCond(), args).graph_module, args


def test_pattern_inside_a_cond_branch():
    gm, args = cond_program()
    want = gm(*args)
    got = assert_same_as_torch(gm, add_relu, add_relu_replacement)
    assert len(got) == 3  # top, then-branch, else-branch
    ours = copy.deepcopy(gm)
    replace_pattern(ours, add_relu, add_relu_replacement)
    for _, m in graph_modules(ours):  # relu(x + y) once in each
        assert [n.target for n in m.graph.nodes].count(aten.clamp.default) == 1
    torch.testing.assert_close(ours(*args), want)


def test_shared_bodies_are_copied_never_rewritten():
    gm, args = cond_program()
    other = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # another program sharing gm's bodies
    bodies = {name: (m, m.code) for name, m in gm.named_children() if isinstance(m, fx.GraphModule)}
    assert {name: m for name, (m, _) in bodies.items()} == {n: getattr(other, n) for n in bodies}
    gm.also_then = gm.true_graph_0  # one body under two names stays one module
    replace_pattern(gm, add_relu, add_relu_replacement)
    for name, (m, code) in bodies.items():
        assert getattr(other, name) is m and m.code == code  # the other program's bodies untouched
        assert getattr(gm, name) is not m and "clamp" in getattr(gm, name).code and "clamp" not in code
    assert gm.also_then is gm.true_graph_0
    torch.testing.assert_close(gm(*args), other(*args))


def test_bodies_without_matches_are_kept():
    gm, _ = cond_program()
    before = dict(gm.named_children())
    replace_pattern(gm, lambda x: aten.sigmoid.default(x), lambda x: x)
    assert dict(gm.named_children()) == before


# --- edge graphs with the patterns executorch uses ---------------------------------------------------


def quantized_edge_graph(seed: int, blocks: int = 24) -> fx.GraphModule:
    """An edge-dialect uint8 graph of the chains executorch's pattern list rewrites, in random
    order and variety: dq -> add [-> relu] -> q, add of a scalar, a dequantize shared by both
    operands (`x + x`) or used outside the chain, dq -> slice -> q, dq -> embedding."""
    from executorch.exir.dialects._ops import ops as exir_ops

    e = exir_ops.edge
    qd, u8 = e.quantized_decomposed, torch.uint8
    rng = random.Random(seed)
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    weight, scales, indices = g.placeholder("weight"), g.placeholder("scales"), g.placeholder("indices")
    qparams = [(0.02, 128), (0.05, 100), (0.1, 3)]

    def q(v, p):
        return g.call_function(qd.quantize_per_tensor.default, (v, *p, 0, 255, u8))

    def dq(v, p):
        return g.call_function(qd.dequantize_per_tensor.default, (v, *p, 0, 255, u8))

    values = [(q(x, qparams[0]), qparams[0]), (q(y, qparams[1]), qparams[1])]
    outputs = []
    for _ in range(blocks):
        (a, pa), (b, pb) = rng.choice(values), rng.choice(values)
        po = rng.choice(qparams)
        kind = rng.choice(["add", "add_relu", "scalar", "shared", "leak", "slice", "embedding"])
        if kind in ("add", "add_relu", "leak"):
            da, db = dq(a, pa), dq(b, pb)
            out = g.call_function(e.aten.add.Tensor, (da, db))
            if kind == "add_relu":
                out = g.call_function(e.aten.relu.default, (out,))
            if kind == "leak":
                outputs.append(da)
        elif kind == "scalar":
            out = g.call_function(e.aten.add.Tensor, (dq(a, pa), rng.choice([1.0, 2, -0.5])))
        elif kind == "shared":
            da = dq(a, pa)
            out = g.call_function(e.aten.add.Tensor, (da, da))
        elif kind == "slice":
            out, po = g.call_function(e.aten.slice_copy.Tensor, (dq(a, pa), 0, 0, 1)), pa
        else:
            w = g.call_function(qd.dequantize_per_channel.default, (weight, scales, None, 0, 0, 255, u8))
            outputs.append(g.call_function(e.aten.embedding.default, (w, indices)))
            continue
        values.append((q(out, po), po))
    g.output(tuple(outputs + [v for v, _ in values[-3:]]))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("seed", range(4))
def test_executorchs_quant_patterns_on_edge_graphs(seed):
    from executorch.exir.passes._quant_patterns_and_replacements import get_quant_patterns_and_replacements

    ours = quantized_edge_graph(seed)
    theirs = copy.deepcopy(ours)
    fused = 0
    for pattern, replacement, filters in get_quant_patterns_and_replacements({}):
        want = subgraph_rewriter.replace_pattern_with_filters(theirs, pattern, replacement, filters)
        got = replace_pattern(ours, pattern, replacement, filters)
        assert ours.code == theirs.code
        assert summary(got) == summary(want)
        fused += len(got)
    assert fused >= 5


# --- random graphs from the fuzz generator --------------------------------------------------------


def traced_model(spec) -> fx.GraphModule:
    """`FuzzModel(spec)` traced with `symbolic_trace` (a forward with one named parameter per
    input: the model's own `*inputs` cannot be traced)."""
    names = ", ".join(f"v{i}" for i in range(len(spec.inputs)))
    scope: dict = {}
    exec(f"def forward(self, {names}):\n    return self.model({names})", scope)
    wrapper = type("Fuzz", (torch.nn.Module,), {"forward": scope["forward"]})()
    wrapper.model = FuzzModel(spec)
    return fx.symbolic_trace(wrapper)


def _add_then_relu_returned(x, y):
    a = x + y
    return a, torch.relu(a)


# torch-level patterns for traced graphs, ATen ones for exported graphs (with control flow)
TRACED_PATTERNS = [
    (lambda a, b: torch.relu(a + b), lambda a, b: torch.clamp(b + a, 0.0), False),
    (lambda a, b: torch.relu(a - b), lambda a, b: torch.sigmoid(b), False),
    (lambda x: x + x, lambda x: x * 2, False),
    (lambda x: torch.nn.functional.hardtanh(x, 0.0, 6.0), lambda x: torch.clamp(x, 0.0, 6.0), False),
    (lambda x: torch.nn.functional.hardtanh(x, 0.0, 6.0), lambda x: torch.clamp(x, 0.0, 6.0), True),
    (lambda x: torch.clamp(x, 0.0, None), lambda x: torch.relu(x), False),
    (lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), False),
    (lambda x, y: (torch.relu(x), x * y), lambda x, y: (torch.sigmoid(x), x - y), False),
    (_add_then_relu_returned, lambda x, y: (x - y, torch.sigmoid(x)), False),
]

EXPORTED_PATTERNS = [
    (add_relu, add_relu_replacement, False),
    (lambda x: aten.add.Tensor(x, x), lambda x: aten.mul.Tensor(x, 2), False),
    (lambda x: aten.hardtanh.default(x, 0.0, 6.0), lambda x: aten.clamp.default(x, 0.0, 6.0), True),
    (lambda x, y: (aten.relu.default(x), aten.mul.Tensor(x, y)),
     lambda x, y: (aten.sigmoid.default(x), aten.sub.Tensor(x, y)), False),
    (lambda i: aten.add.Tensor(i, 1), lambda i: aten.sub.Tensor(i, -1), False),  # a while loop's counter
    (lambda a, b: aten.sub.Tensor(a, b), lambda a, b: aten.add.Tensor(aten.neg.default(b), a), False),
]


def fuzz_specs(n: int, control_flow: bool) -> list:
    rng = random.Random(1212)
    out = []
    while len(out) < n:
        spec = generate(RandomDraw(rng), quant=False)
        # the fuzz generator's blocks (attention, KV-cache writes, ...) are export-only: these
        # graphs are also traced with fx.symbolic_trace, as replace_pattern's users trace theirs
        if spec.has_control_flow == control_flow and not spec.blocks():
            out.append(spec)
    return out


def _check_all(graphs, patterns) -> tuple[int, int]:
    """Matches in all graphs, and in control-flow bodies alone."""
    matched = in_bodies = 0
    for spec, gm in graphs:
        for k, (pattern, replacement, ignore) in enumerate(patterns):
            per_graph: dict = {}
            try:
                matched += len(assert_same_as_torch(gm, pattern, replacement, ignore_literals=ignore, per_graph=per_graph))
            except AssertionError as e:
                raise AssertionError(f"pattern {k} on\n{spec}\n{e}") from e
            in_bodies += sum(n for name, n in per_graph.items() if name)
    return matched, in_bodies


def test_random_graphs():
    graphs = [(spec, traced_model(spec)) for spec in fuzz_specs(48, control_flow=False)]
    # the patterns do fire on these graphs (29 matches when linear_dq's block joined fuzz_blocks:
    # the sample shifts whenever the generator's block table grows, so the bound leaves room)
    assert _check_all(graphs, TRACED_PATTERNS)[0] >= 24


def test_random_graphs_with_control_flow():
    graphs = []
    for spec in fuzz_specs(8, control_flow=True):  # while, cond and scan bodies (6 matched in them)
        with torch.no_grad():
            graphs.append((spec, torch.export.export(FuzzModel(spec), example_inputs(spec)).graph_module))
    matched, in_bodies = _check_all(graphs, EXPORTED_PATTERNS)
    assert in_bodies >= 4  # these patterns fire in the bodies (the top graphs have few)
