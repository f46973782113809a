"""Tracing rules: a rule's ATen pattern (or function replacement) exported and lowered with
`to_edge` into the edge-dialect graph the engine matches (`EdgePattern`), alone or many rules in
one export, through the on-disk cache (trace_cache.py). The rule records are in rule.py.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import torch
import torch.fx as fx

from .rule import EdgePattern, PatternError, Rule


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
    return _trace(rule, rule.pattern, "pattern")


def trace_replacement(rule: Rule) -> EdgePattern:
    """Export the rule's function replacement with the pattern's example inputs and lower it with
    `to_edge` (not cached; `Rule.replacement_graph` caches). Backend ops stay themselves
    (`to_edge` would decompose them into their patterns)."""
    return _trace(rule, rule.replacement, "replacement", _catalog_ops())


def _catalog_ops() -> list:
    from etfuse.backend_ops import CATALOG

    return [op.aten for op in CATALOG]


def _trace(rule: Rule, fn: Callable, what: str, preserve_ops=()) -> EdgePattern:
    params, inputs, tensors, scalars = _examples(rule)
    try:
        lowered_ep = _to_edge(_PatternModule(fn, inputs), tensors, preserve_ops)
    except Exception as e:  # noqa: BLE001 - re-raised with the rule's name
        raise PatternError(f"rule {rule.name!r}: its {what} does not export/lower to the edge dialect: {e}") from e
    graph = lowered_ep.graph_module.graph
    user_inputs = list(lowered_ep.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    extra = [n.name for n in placeholders if n.name not in user_inputs]
    if extra:
        raise PatternError(
            f"rule {rule.name!r}: the lowered {what} reads constants or parameters {extra}; a {what} may only "
            "read the pattern's inputs (pass tensors in as parameters)"
        )
    tensor_params = [n for n, v in zip(params, inputs) if isinstance(v, torch.Tensor)]
    for p, name in zip(placeholders, tensor_params):
        p.name = p.target = name  # bindings are named after the pattern's parameters
    return _finish(rule, graph, params, scalars, replacement=what == "replacement")


def _finish(rule: Rule, graph: fx.Graph, params: list, scalars: dict, replacement: bool = False) -> EdgePattern:
    _bind_scalars(graph, rule, scalars)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in graph.nodes if n.op == "output").args[0]
    what = "replacement" if replacement else "pattern"
    if not outputs or any(not isinstance(o, fx.Node) or o.op != "call_function" for o in outputs):
        raise PatternError(f"rule {rule.name!r}: a {what} must compute its results from its inputs, got {outputs}")
    if len(set(outputs)) != len(outputs):
        raise PatternError(f"rule {rule.name!r}: the {what} returns the same value twice")
    anchor = outputs[0] if replacement else _last_output(rule, outputs)
    ops = [n for n in graph.nodes if n.op == "call_function"]
    unused = [p.name for p in placeholders if not p.users]
    if unused and not replacement:
        raise PatternError(f"rule {rule.name!r}: pattern parameters {unused} vanish when lowered to the edge dialect")
    return EdgePattern(graph, params, anchor, ops, list(outputs))


def _last_output(rule: Rule, outputs) -> fx.Node:
    """The output every other output feeds: matching starts there and walks backwards, so a
    pattern's outputs must all be reachable from one of them."""
    for candidate in outputs:
        seen, todo = set(), [candidate]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(n.all_input_nodes)
        if all(o in seen for o in outputs):
            return candidate
    raise PatternError(f"rule {rule.name!r}: the pattern's outputs {[o.name for o in outputs]} are not all inputs "
                       "of one of them; etfuse matches backwards from an output that the others feed")


class _PatternsModule(torch.nn.Module):
    """Several patterns side by side: inputs concatenated, one output (a tensor or a tuple) per
    pattern; the exported program's output spec tells how many values each returned."""

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


def trace_edge_patterns(rules: list[Rule], replacements: bool = False) -> dict[Rule, EdgePattern]:
    """Trace many patterns (or, with `replacements`, many function replacements) with one export
    and one `to_edge` (each costs about a second however small the graph): {rule: its
    edge-dialect graph}, not cached. A rule whose function cannot be traced this way is left out
    (`trace_edge_pattern` / `trace_replacement` then says why); so are all of them if the export
    of the whole fails."""
    def fn(r):
        return r.replacement if replacements else r.pattern

    try:
        examples = [_examples(r) for r in rules]
        # rules with the same function, example inputs and parameters (a rule and its twin that
        # only a constraint tells apart) share one traced copy; each gets its own graph below
        keys = [(fn(r), r.example_inputs, tuple(ex[0])) for r, ex in zip(rules, examples)]
        first = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        parts = list(first.values())
        module = _PatternsModule([(fn(rules[i]), examples[i][1]) for i in parts])
        preserve = _catalog_ops() if replacements else ()
        lowered_ep = _to_edge(module, tuple(t for i in parts for t in examples[i][2]), preserve)
    except Exception:  # noqa: BLE001 - each rule is traced alone, and fails with its own message
        return {}
    graph = lowered_ep.graph_module.graph
    user_inputs = set(lowered_ep.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    outputs = list(next(n for n in graph.nodes if n.op == "output").args[0])
    arities = [spec.num_leaves for spec in lowered_ep.call_spec.out_spec.children()]
    if len(arities) != len(parts) or len(outputs) != sum(arities):
        return {}
    part_io, start = {}, 0
    for i, arity in zip(parts, arities):
        part_io[keys[i]] = placeholders[start:start + len(examples[i][2])], outputs[:arity]
        start += len(examples[i][2])
        outputs = outputs[arity:]
    traced = {}
    for rule, key, (params, inputs, tensors, scalars) in zip(rules, keys, examples):
        mine, outs = part_io[key]
        names = [n for n, v in zip(params, inputs) if isinstance(v, torch.Tensor)]
        try:
            traced[rule] = _finish(rule, _subgraph(graph, outs, dict(zip(mine, names))), params, scalars,
                                   replacement=replacements)
        except PatternError:
            pass
    return traced


def _subgraph(graph: fx.Graph, outs: list, inputs: dict[fx.Node, str]) -> fx.Graph:
    """A new graph computing `outs` from the placeholders `inputs` (renamed) and nothing else."""
    if not all(isinstance(o, fx.Node) for o in outs):
        raise PatternError("not a node")
    needed, todo = set(), list(outs)
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
    new.output(tuple(env[o] for o in outs))
    return new


def traced(rules: list[Rule], replacements: bool = False, batch: bool = False) -> dict[Rule, EdgePattern]:
    """The rules' patterns (or function replacements) as traced, from the on-disk cache where it
    has them (trace_cache.py), the others traced and added to it. `batch`: trace them in one
    export, leaving out those that fail (they are traced alone later, and fail with their own
    message); otherwise each alone, raising PatternError."""
    from . import trace_cache

    found = trace_cache.lookup(rules, replacements)
    todo = [r for r in rules if r not in found]
    if batch:
        traced = trace_edge_patterns(todo, replacements) if len(todo) > 1 else {}
    else:
        traced = {r: (trace_replacement(r) if replacements else trace_edge_pattern(r)) for r in todo}
    trace_cache.store(traced, replacements)
    return {**found, **traced}
