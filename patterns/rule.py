"""A fusion rule is data: an ATen pattern, what replaces it (a backend op, or any function of
ops), and a constraint.

Rules are written once with ATen ops. `edge_pattern()` exports the pattern and runs it through
`to_edge` (once per rule and process; `edge_patterns(rules)` traces many in one export), so it matches edge-dialect graphs exactly as the user's program was lowered
(`aten.linear` becomes `permute_copy -> addmm`, constants are lifted, ...). A pattern that can
never match an edge graph is a `PatternError` when it is lowered, not a silent no-op.

A replacement that is a function (not one `BackendOp`) is exported and lowered the same way, with
the same example inputs and the same parameters (scalars and `QuantRule` dtypes included), and the
engine inlines its graph at the match (`Rule.replacement_graph()`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Optional, Union

import torch
import torch.fx as fx

from etfuse.backend_ops import BackendOp
from etfuse.errors import EtfuseError


class PatternError(EtfuseError, ValueError):
    """A rule's pattern cannot be lowered to something that matches edge-dialect graphs."""


@dataclasses.dataclass
class Match:
    """One occurrence of a rule's pattern in a graph."""

    rule: "Rule"
    anchor: fx.Node
    nodes: list[fx.Node]  # the graph nodes the pattern's ops matched, in pattern order
    bindings: dict[str, Any]  # pattern parameter name -> graph node or literal
    # placeholder name -> real tensor, for graphs whose weights are placeholders (a pass's
    # `node_value_dict`, as executorch's QuantFusionPass takes it)
    known_values: Optional[dict] = None

    def value(self, name: str):
        """The bound value: `meta["val"]` (a fake tensor or SymInt) for nodes, else the literal."""
        bound = self.bindings[name]
        return bound.meta.get("val") if isinstance(bound, fx.Node) else bound

    @property
    def anchor_value(self):
        return self.anchor.meta.get("val")

    def constant(self, name: str) -> Optional[torch.Tensor]:
        """The real tensor bound to parameter `name` when the program knows it (a constant the
        fake tensor carries, a `get_attr` of the graph's module, or a placeholder in the pass's
        `node_value_dict`), else None. For constraints that depend on weight values."""
        bound = self.bindings.get(name)
        if not isinstance(bound, fx.Node):
            return bound if isinstance(bound, torch.Tensor) else None
        if bound.op == "get_attr":
            owner = bound.graph.owning_module
            value = getattr(owner, str(bound.target), None) if owner is not None else None
            return value if isinstance(value, torch.Tensor) else None
        if bound.op == "placeholder" and self.known_values and bound.name in self.known_values:
            return self.known_values[bound.name]
        return getattr(bound.meta.get("val"), "constant", None)


Constraint = Callable[[Match], Optional[str]]  # returns why the match is declined, or None


@dataclasses.dataclass(eq=False)
class EdgePattern:
    graph: fx.Graph
    params: list[str]  # pattern parameter names, in placeholder order
    anchor: fx.Node  # the pattern's last op: where matching starts
    ops: list[fx.Node]  # call_function nodes in topological order

    @property
    def size(self) -> int:
        return len(self.ops)


@dataclasses.dataclass(eq=False)
class Rule:
    """`pattern` (ATen) -> `replacement`, if `constraint` accepts the match.

    A `BackendOp` replacement is called with the pattern's bindings by parameter name, unless
    `arguments` maps a match to the replacement's (args, kwargs) itself. A function replacement
    takes the pattern's parameters (it may ignore some) and may call any ops, backend ops
    included; it is lowered like the pattern and inlined at the match with the same bindings.
    """

    name: str
    pattern: Callable
    replacement: Union[BackendOp, Callable]
    example_inputs: Callable[[], tuple]
    constraint: Optional[Constraint] = None
    arguments: Optional[Callable[[Match], tuple[tuple, dict]]] = None
    # Names of rules with the same anchor op that this rule is tried before, whatever the
    # pattern sizes (without it, the larger pattern is tried first). See passes/engine.py.
    outranks: tuple[str, ...] = ()

    @classmethod
    def for_op(cls, op: BackendOp, example_inputs, constraint=None, name=None, outranks=()) -> "Rule":
        """The common case: the backend op's own pattern is what the rule looks for."""
        return cls(name or op.name, op.pattern, op, example_inputs, constraint, outranks=tuple(outranks))

    def __post_init__(self):
        if not isinstance(self.replacement, BackendOp):
            if not callable(self.replacement):
                raise PatternError(f"rule {self.name!r}: the replacement must be a BackendOp or a function of ops, "
                                   f"got {type(self.replacement).__name__}")
            if self.arguments is not None:
                raise PatternError(f"rule {self.name!r}: `arguments` maps a match to a BackendOp's arguments; a "
                                   "function replacement takes the pattern's parameters itself")

    @property
    def key(self) -> str:
        """Unique in a rule table: `etfuse::add_relu` and `quantized_decomposed::add_relu` are two rules."""
        namespace = self.replacement.namespace if isinstance(self.replacement, BackendOp) else "function"
        return f"{namespace}::{self.name}"

    def replacement_graph(self) -> Optional["EdgePattern"]:
        """A function replacement as an edge-dialect graph (traced once per rule and process; its
        `anchor` is the output), or None for a BackendOp replacement."""
        if isinstance(self.replacement, BackendOp):
            return None
        if self not in _TRACED_REPLACEMENTS:
            _TRACED_REPLACEMENTS[self] = self.bind_literals(trace_replacement(self), replacement=True)
        return _TRACED_REPLACEMENTS[self]

    def produces(self) -> list:
        """The ATen overloads the replacement puts into a graph."""
        if isinstance(self.replacement, BackendOp):
            return [self.replacement.aten]
        return [getattr(n.target, "_op", n.target) for n in self.replacement_graph().ops]

    def edge_pattern(self) -> EdgePattern:
        """The pattern as an edge-dialect graph (traced once per rule and process; `edge_patterns`
        traces many rules at once)."""
        if self not in _TRACED:
            _TRACED[self] = self.bind_literals(trace_edge_pattern(self))
        return _TRACED[self]

    def bind_literals(self, traced: EdgePattern, replacement: bool = False) -> EdgePattern:
        """Turn literals the rule treats as parameters into placeholders (scalars already are).
        `replacement`: `traced` is the replacement's graph, which may leave parameters unused."""
        return traced

    def replacement_call(self, m: Match) -> tuple[tuple, dict]:
        if self.arguments is not None:
            return self.arguments(m)
        args, kwargs = [], {}
        for name in self.replacement.arg_names:
            if name not in m.bindings:
                continue
            if kwargs or len(args) < self.replacement.arg_names.index(name):
                kwargs[name] = m.bindings[name]
            else:
                args.append(m.bindings[name])
        return tuple(args), kwargs


class _PatternModule(torch.nn.Module):
    """Exports `fn` with its tensor parameters as inputs and its scalar parameters baked in."""

    def __init__(self, fn, inputs: tuple):
        super().__init__()
        self.fn = fn
        self.inputs = inputs

    def forward(self, *tensors):
        it = iter(tensors)
        return self.fn(*(next(it) if isinstance(v, torch.Tensor) else v for v in self.inputs))


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scalars_by_value(rule: "Rule", scalars: dict[str, Any]) -> dict[tuple, str]:
    by_value: dict[tuple, str] = {}
    for name, v in scalars.items():
        key = (type(v), v)
        if key in by_value:
            raise PatternError(
                f"rule {rule.name!r}: scalar parameters {by_value[key]!r} and {name!r} have the same example "
                f"value {v!r}; give each scalar parameter a distinct example value"
            )
        by_value[key] = name
    return by_value


def _bind_scalars(graph: fx.Graph, rule: "Rule", scalars: dict[str, Any]) -> None:
    """Turn the literals that carry scalar parameters (qparams, ...) into placeholders.

    Export bakes Python scalars into the ops that use them; the example values identify where
    they went, which is why each scalar parameter needs a value no other scalar parameter has.
    """
    by_value = _scalars_by_value(rule, scalars)
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first_op):
        holders = {name: graph.placeholder(name) for name in scalars}

    def substitute(a):
        if isinstance(a, (list, tuple)):
            return type(a)(substitute(x) for x in a)
        if _is_scalar(a) and (type(a), a) in by_value:
            return holders[by_value[(type(a), a)]]
        return a

    for n in graph.nodes:
        if n.op == "call_function":
            n.args = substitute(n.args)
            n.kwargs = {k: substitute(v) for k, v in n.kwargs.items()}


_TRACED: dict["Rule", EdgePattern] = {}  # Rule.edge_pattern's cache (rules hash by identity)
_TRACED_REPLACEMENTS: dict["Rule", EdgePattern] = {}  # Rule.replacement_graph's cache


def _examples(rule: Rule) -> tuple[list, tuple, tuple, dict]:
    """(parameter names, example inputs, the tensor ones, {scalar parameter: value}), checked."""
    params = [p for p in inspect.signature(rule.pattern).parameters]
    inputs = tuple(rule.example_inputs())
    if len(inputs) > len(params):
        raise PatternError(f"rule {rule.name!r}: {len(inputs)} example inputs for {len(params)} pattern parameters")
    params = params[: len(inputs)]
    bad = [n for n, v in zip(params, inputs) if not isinstance(v, torch.Tensor) and not _is_scalar(v)]
    if bad:
        raise PatternError(f"rule {rule.name!r}: parameters {bad} must have tensor, int or float example inputs")
    tensors = tuple(v for v in inputs if isinstance(v, torch.Tensor))
    scalars = {n: v for n, v in zip(params, inputs) if _is_scalar(v)}
    _scalars_by_value(rule, scalars)  # fail before the slow export
    return params, inputs, tensors, scalars


def _to_edge(module: torch.nn.Module, tensors: tuple, preserve_ops=()):
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(module, tensors, strict=False)
    config = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=list(preserve_ops))
    return to_edge(ep, compile_config=config).exported_program()


def trace_edge_pattern(rule: Rule) -> EdgePattern:
    """Export the rule's pattern and lower it with `to_edge`: its edge-dialect graph (not cached)."""
    params, inputs, tensors, scalars = _examples(rule)
    try:
        lowered_ep = _to_edge(_PatternModule(rule.pattern, inputs), tensors)
    except Exception as e:  # noqa: BLE001 - re-raised with the rule's name
        raise PatternError(f"rule {rule.name!r}: its pattern does not export/lower to the edge dialect: {e}") from e
    graph = lowered_ep.graph_module.graph
    user_inputs = list(lowered_ep.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    extra = [n.name for n in placeholders if n.name not in user_inputs]
    if extra:
        raise PatternError(
            f"rule {rule.name!r}: the lowered pattern reads constants or parameters {extra}; a pattern may only "
            "read its own inputs (pass tensors in as parameters)"
        )
    tensor_params = [n for n, v in zip(params, inputs) if isinstance(v, torch.Tensor)]
    for p, name in zip(placeholders, tensor_params):
        p.name = p.target = name  # bindings are named after the pattern's parameters
    return _finish(rule, graph, params, scalars)


def trace_replacement(rule: Rule) -> EdgePattern:
    """Export the rule's function replacement with the pattern's example inputs and lower it with
    `to_edge` (not cached; `Rule.replacement_graph` caches)."""
    params, inputs, tensors, scalars = _examples(rule)
    try:
        # backend ops stay themselves (to_edge would decompose them into their patterns)
        from etfuse.backend_ops import CATALOG

        lowered_ep = _to_edge(_PatternModule(rule.replacement, inputs), tensors, [op.aten for op in CATALOG])
    except Exception as e:  # noqa: BLE001 - re-raised with the rule's name
        raise PatternError(f"rule {rule.name!r}: its replacement does not export/lower to the edge dialect: {e}") from e
    graph = lowered_ep.graph_module.graph
    user_inputs = list(lowered_ep.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    extra = [n.name for n in placeholders if n.name not in user_inputs]
    if extra:
        raise PatternError(f"rule {rule.name!r}: the lowered replacement reads constants or parameters {extra}; "
                           "a replacement may only read the pattern's parameters")
    tensor_params = [n for n, v in zip(params, inputs) if isinstance(v, torch.Tensor)]
    for p, name in zip(placeholders, tensor_params):
        p.name = p.target = name
    return _finish(rule, graph, params, scalars, replacement=True)


def _finish(rule: Rule, graph: fx.Graph, params: list, scalars: dict, replacement: bool = False) -> EdgePattern:
    _bind_scalars(graph, rule, scalars)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in graph.nodes if n.op == "output").args[0]
    what = "replacement" if replacement else "pattern"
    if len(outputs) != 1 or not isinstance(outputs[0], fx.Node) or outputs[0].op != "call_function":
        raise PatternError(f"rule {rule.name!r}: a {what} must compute exactly one tensor from its inputs, got {outputs}")
    ops = [n for n in graph.nodes if n.op == "call_function"]
    unused = [p.name for p in placeholders if not p.users]
    if unused and not replacement:
        raise PatternError(f"rule {rule.name!r}: pattern parameters {unused} vanish when lowered to the edge dialect")
    return EdgePattern(graph, params, outputs[0], ops)


class _PatternsModule(torch.nn.Module):
    """Several patterns side by side: inputs concatenated, one output per pattern."""

    def __init__(self, parts: list[tuple[Callable, tuple]]):
        super().__init__()
        self.parts = [_PatternModule(fn, inputs) for fn, inputs in parts]
        self.sizes = [sum(isinstance(v, torch.Tensor) for v in inputs) for _, inputs in parts]

    def forward(self, *tensors):
        out, start = [], 0
        for part, size in zip(self.parts, self.sizes):
            out.append(part(*tensors[start:start + size]))
            start += size
        return tuple(out)


def trace_edge_patterns(rules: list[Rule]) -> dict[Rule, EdgePattern]:
    """Trace many patterns with one export and one `to_edge` (each costs about a second however
    small the graph): {rule: its edge-dialect graph}, not cached. A rule whose pattern cannot be
    traced this way is left out (`trace_edge_pattern` then says why); so are all of them if the
    export of the whole fails."""
    try:
        examples = [_examples(r) for r in rules]
        module = _PatternsModule([(r.pattern, ex[1]) for r, ex in zip(rules, examples)])
        lowered_ep = _to_edge(module, tuple(t for ex in examples for t in ex[2]))
    except Exception:  # noqa: BLE001 - each rule is traced alone, and fails with its own message
        return {}
    graph = lowered_ep.graph_module.graph
    user_inputs = set(lowered_ep.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    outputs = next(n for n in graph.nodes if n.op == "output").args[0]
    if len(outputs) != len(rules):
        return {}
    traced, start = {}, 0
    for rule, (params, inputs, tensors, scalars), out in zip(rules, examples, outputs):
        mine = placeholders[start:start + len(tensors)]
        start += len(tensors)
        names = [n for n, v in zip(params, inputs) if isinstance(v, torch.Tensor)]
        try:
            traced[rule] = _finish(rule, _subgraph(graph, out, dict(zip(mine, names))), params, scalars)
        except PatternError:
            pass
    return traced


def _subgraph(graph: fx.Graph, out, inputs: dict[fx.Node, str]) -> fx.Graph:
    """A new graph computing `out` from the placeholders `inputs` (renamed) and nothing else."""
    if not isinstance(out, fx.Node):
        raise PatternError("not a node")
    needed, todo = set(), [out]
    while todo:
        n = todo.pop()
        if n not in needed:
            needed.add(n)
            todo.extend(n.all_input_nodes)
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for p, name in inputs.items():
        env[p] = new.placeholder(name)
        env[p].name = name  # as trace_edge_pattern names them (fx would avoid builtins: `input_1`)
        env[p].meta = dict(p.meta)
    for n in graph.nodes:
        if n not in needed or n in env:
            continue
        if n.op != "call_function":
            raise PatternError(f"reads {n.op} {n.name}")
        # the name a pattern traced alone would have: no suffix from the other patterns' nodes
        env[n] = new.create_node("call_function", n.target, fx.map_arg(n.args, env.__getitem__),
                                 fx.map_arg(n.kwargs, env.__getitem__), name=re.sub(r"_\d+$", "", n.name))
        env[n].meta = dict(n.meta)
    new.output((env[out],))
    return new


def edge_patterns(rules) -> list[EdgePattern]:
    """`rule.edge_pattern()` for each rule, the ones not traced yet traced together."""
    rules = list(rules)
    todo = [r for r in dict.fromkeys(rules) if r not in _TRACED]
    if len(todo) > 1:
        for rule, traced in trace_edge_patterns(todo).items():
            _TRACED[rule] = rule.bind_literals(traced)
    return [r.edge_pattern() for r in rules]
