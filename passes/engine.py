"""The rewrite engine: rules indexed by their pattern's last op, matched locally, applied in place.

Cost is linear in the graph: candidates are the nodes whose target is some rule's anchor
(`graph.find_nodes`), each is matched backwards from the anchor over at most the pattern's size,
and each match is replaced by one node (or a function replacement's nodes) inserted at the anchor.
Because a match's interior nodes may have no users outside the match, every input of the match
precedes the anchor, so inserting there can never create a cycle: the cycle check is free,
bounded by node order. A pattern with several outputs lets those have outside users; its
replacement goes before the first of them, and the match is declined if an input comes later.

A commutative op's operands (`add`, `mul`) are matched as written, then swapped: at the op when
the pattern's operands do not fit, and for the whole match when it fits but fails the checks
below (an interior node read outside the match), so `x + bn(conv(h))` with x a conv read
elsewhere still finds the second conv.

Priority is data, never pass order. A sweep goes bottom-up (last node first), so a match ending
later in the graph claims its nodes first: `q(relu(add(dq, dq)))` is the quantized add_relu
(ending at the quantize), not the float one inside it (ending at the relu). At one node, rules
are tried in `RuleIndex` order: a rule before those it names in `Rule.outranks`, otherwise the
largest pattern first; the first accepted match wins. One sweep
finds everything unless a rule's pattern consumes another rule's backend op (`RuleIndex.chains`);
then sweeps repeat until nothing changes.

Near misses (asked for with `find_matches(..., near_misses=True)`, or `FusionPass(...,
near_misses=True)`): for an anchor no rule fused, each rule whose anchor op matched but whose
pattern did not is recorded in `FusionReport.near_misses` with the first point of difference,
the pattern node where the comparison that got furthest failed. The matcher notes that point as
it fails anyway, so asking costs no extra graph walk.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from collections import defaultdict
from typing import Any, Iterable, Optional

import torch
import torch.fx as fx
from executorch.exir.dialects.edge._ops import EdgeOpOverload

from etfuse.patterns.rule import ANY_SIZES, EdgePattern, Match, Rule, edge_patterns
from etfuse.errors import EtfuseError

# (self, other) of these may be swapped: x + y == y + x. Keyed by the ATen overload so edge and
# ATen targets both resolve.
_COMMUTATIVE = {torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor}


class FusionError(EtfuseError, RuntimeError):
    """A rule failed while being applied; the message names the rule, the graph and the node."""


@dataclasses.dataclass
class Fused:
    rule: str
    graph: str  # "" for the top graph, else the submodule path, e.g. "true_graph_0"
    node: str  # the new backend-op node
    replaced: list[str]  # the nodes it replaced, anchor last


@dataclasses.dataclass
class Declined:
    rule: str
    graph: str
    node: str  # the anchor the pattern matched at
    reason: str


@dataclasses.dataclass
class NearMiss:
    """A rule whose anchor op matched at `node` but whose pattern did not."""

    rule: str
    graph: str
    node: str  # the anchor
    expected: str  # the pattern node where matching failed: an op ("aten.addmm.default") or a parameter name
    found: str  # what the graph has there: an op, "placeholder", "literal 2.0", ...
    reason: str  # one line: "expected aten.addmm.default, found aten.add.Tensor (aten_add_tensor)"
    matched: int  # pattern ops matched before the difference (1: only the anchor)
    size: int  # pattern ops in the rule


@dataclasses.dataclass
class FusionReport:
    fused: list[Fused] = dataclasses.field(default_factory=list)
    declined: list[Declined] = dataclasses.field(default_factory=list)
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)  # only when asked

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.fused:
            out[f.rule] += 1
        return dict(out)

    def extend(self, other: "FusionReport") -> None:
        self.fused += other.fused
        self.declined += other.declined
        self.near_misses += other.near_misses


def _aten(target):
    """The ATen overload behind an edge/backend op (EdgeOpOverload keeps it in `_op`)."""
    return getattr(target, "_op", target)


def _schema_args(node: fx.Node) -> list[Any]:
    """All of a node's arguments in schema order, defaults filled in, so `add(a, b)` and
    `add(a, b, alpha=1)` compare equal."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return list(node.args) + list(node.kwargs.values())
    out = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out.append(node.args[i])
        elif arg.name in node.kwargs:
            out.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            out.append(arg.default_value)
        else:
            out.append(None)
    return out


def _literal_equal(a, b) -> bool:
    if a is ANY_SIZES:  # a free_sizes rule's view/expand sizes (its constraint checks shapes)
        return isinstance(b, (list, tuple))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_literal_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b  # alpha=1 and alpha=1.0 are the same literal


def _describe(value, with_name: bool = True) -> str:
    """A graph value in a near-miss message: the op of a node, or the literal."""
    if isinstance(value, fx.Node):
        if value.op == "call_function":
            return f"{_op_name(value.target)} ({value.name})" if with_name else _op_name(value.target)
        return f"{value.op} {value.name}" if with_name else value.op
    return f"literal {value!r}"


def _op_name(target) -> str:
    target = _aten(target)
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.add.Tensor"
    return getattr(target, "__name__", str(target))


def _why(pnode: Optional[fx.Node], gvalue, kind: str, detail) -> str:
    """The one-line reason for a recorded miss (formatted only when a near miss is reported)."""
    if kind == "op":
        return f"expected {_op_name(pnode.target)}, found {_describe(gvalue)}"
    if kind == "users":
        return f"{gvalue.name} is also used outside the match, by {', '.join(u.name for u in detail[:3])}"
    if kind == "binding":
        return f"{pnode.name} must be the same value in both places, found {_describe(gvalue)}"
    if kind == "shared":
        return f"{_describe(gvalue)} is matched twice"
    if kind == "arity":
        return f"{detail[0]} arguments where the pattern has {detail[1]}"
    if kind == "literal":
        return f"argument {gvalue!r} where the pattern has {detail!r}"
    if kind == "inside":
        return f"{pnode.name} would be {gvalue.name}, which the match itself computes"
    return kind


class _Matcher:
    """Matches one lowered pattern backwards from a graph node. Pure: never touches the graph.

    After a failed `match`, `miss` is (pattern node, graph value, kind, detail) where the attempt
    that matched the most pattern ops failed: the first point of difference, for near misses.
    """

    def __init__(self, pattern: EdgePattern, skips: frozenset = frozenset()):
        self.pattern = pattern
        self.skips = skips  # graph ops the match may step over (Rule.skips)
        self.pattern_args = {n: _schema_args(n) for n in pattern.ops}
        self.miss: Optional[tuple] = None
        self._miss_depth = -1
        self._swap_first: frozenset = frozenset()  # commutative pattern ops tried swapped first
        self._checks_failed = False  # the last attempt matched the ops but failed match()'s checks

    def match(self, anchor: fx.Node, graph_args: dict) -> Optional[tuple[dict, dict]]:
        """`graph_args` memoises `_schema_args` of graph nodes across rules and anchors."""
        self.graph_args = graph_args
        self.miss, self._miss_depth = None, -1
        self._swap_first, self._checks_failed = frozenset(), False
        found = self._match_once(anchor)
        if found is None and self._checks_failed:
            # The operands of a commutative op matched one way round, but the match failed its
            # checks (`x + y` against `bn(conv(h)) + r` with x a conv whose output is read
            # elsewhere): the other way round may pass them (y the conv, x the residual).
            for swap in self._swap_orders():
                self._swap_first = swap
                found = self._match_once(anchor)
                if found is not None:
                    break
            self._swap_first = frozenset()
        return found

    def _swap_orders(self):
        """Non-empty sets of the pattern's commutative ops, each tried with its operands swapped
        first (at most 3 ops: 7 sets)."""
        ops = [n for n in self.pattern.ops if _aten(n.target) in _COMMUTATIVE][:3]
        return [frozenset(c) for k in range(1, len(ops) + 1) for c in itertools.combinations(ops, k)]

    def _match_once(self, anchor: fx.Node) -> Optional[tuple[dict, dict]]:
        state = self._node(self.pattern.anchor, anchor, ({}, {}))
        if state is None:
            return None
        self._checks_failed = True
        bindings, matched = state
        # An intermediate with users outside the match must survive: not fusable. (A pattern's
        # outputs may have them: the replacement provides those values.)
        inside = set(matched.values())
        # A parameter bound to a matched op (`y + y` against `linear(x) + residual`: the residual
        # is the linear itself) would be read after the replacement erased it.
        for name, value in bindings.items():
            if isinstance(value, fx.Node) and value in inside:
                pnode = next(p for p in self.pattern.graph.nodes if p.op == "placeholder" and p.name == name)
                self.miss, self._miss_depth = (pnode, value, "inside", None), len(matched)
                return None
        outputs = self.pattern.outputs
        for pnode, gnode in matched.items():
            if pnode not in outputs:
                outside = [u for u in gnode.users if u not in inside]
                if outside:
                    self.miss, self._miss_depth = (pnode, gnode, "users", outside), len(matched)
                    return None
        self._checks_failed = False
        return bindings, matched

    def _fail(self, pnode: Optional[fx.Node], gvalue, matched: dict, kind: str, detail=None):
        # Two comparisons and a tuple on a path that fails anyway: keeps the deepest failure,
        # formatted into words only if a near miss is reported (`_why`). An op whose own
        # arguments differ (a literal, a list length) did not match: it does not count.
        depth = len(matched) - (kind in ("literal", "arity") and pnode in matched)
        if depth > self._miss_depth:
            self.miss, self._miss_depth = (pnode, gvalue, kind, detail), depth
        return None

    def _node(self, pnode: fx.Node, gvalue, state):
        bindings, matched = state
        if pnode.op == "placeholder":
            if pnode.name in bindings:
                if bindings[pnode.name] is gvalue or _literal_equal(bindings[pnode.name], gvalue):
                    return state
                return self._fail(pnode, gvalue, matched, "binding")
            return {**bindings, pnode.name: gvalue}, matched
        if (self.skips and isinstance(gvalue, fx.Node) and gvalue.op == "call_function" and gvalue.target != pnode.target
                and _aten(gvalue.target) in self.skips and ("after", pnode) not in matched
                and gvalue not in matched.values()):
            # a value-preserving copy (Rule.skips) between two pattern ops: matched, then stepped over
            return self._node(pnode, gvalue.args[0], (bindings, {**matched, ("after", pnode): gvalue}))
        if not isinstance(gvalue, fx.Node) or gvalue.op != "call_function" or gvalue.target != pnode.target:
            return self._fail(pnode, gvalue, matched, "op")
        if pnode in matched:
            return state if matched[pnode] is gvalue else self._fail(pnode, gvalue, matched, "shared")
        if gvalue in matched.values():
            return self._fail(pnode, gvalue, matched, "shared")
        state = (bindings, {**matched, pnode: gvalue})
        gargs = self.graph_args.get(gvalue)
        if gargs is None:
            gargs = self.graph_args[gvalue] = _schema_args(gvalue)
        pargs = self.pattern_args[pnode]
        if _aten(pnode.target) not in _COMMUTATIVE:
            return self._args(pargs, gargs, state, pnode)
        swapped = [gargs[1], gargs[0], *gargs[2:]]
        first, second = (swapped, gargs) if pnode in self._swap_first else (gargs, swapped)
        result = self._args(pargs, first, state, pnode)
        return result if result is not None else self._args(pargs, second, state, pnode)

    def _args(self, pargs, gargs, state, owner: Optional[fx.Node] = None):
        if len(pargs) != len(gargs):
            return self._fail(owner, gargs, state[1], "arity", (len(gargs), len(pargs)))
        for p, g in zip(pargs, gargs):
            if isinstance(p, fx.Node):
                state = self._node(p, g, state)
            elif isinstance(p, (list, tuple)) and any(isinstance(x, fx.Node) for x in p):
                if not isinstance(g, (list, tuple)) or len(g) != len(p):
                    return self._fail(owner, g, state[1], "arity", (len(g) if isinstance(g, (list, tuple)) else 1, len(p)))
                state = self._args(list(p), list(g), state, owner)
            elif not _literal_equal(p, g):
                return self._fail(owner, g, state[1], "literal", p)
            if state is None:
                return None
        return state


class RuleIndex:
    """Rules grouped by the target of their pattern's last op, in the order they are tried there:
    a rule before those it `outranks`, otherwise the larger pattern first (then table order)."""

    def __init__(self, rules: Iterable[Rule]):
        self.rules = list(rules)
        keys = [r.key for r in self.rules]
        dup = {r.name for r in self.rules if keys.count(r.key) > 1}
        if dup:
            raise ValueError(f"rule names must be unique; repeated: {sorted(dup)}")
        self.by_anchor: dict[Any, list[tuple[Rule, _Matcher]]] = defaultdict(list)
        for rule, pattern in zip(self.rules, edge_patterns(self.rules)):  # one export for all new ones
            self.by_anchor[pattern.anchor.target].append((rule, _Matcher(pattern, frozenset(rule.skips))))
        anchor_of = {r.name: t for t, entries in self.by_anchor.items() for r, _ in entries}
        for rule in self.rules:
            for other in rule.outranks:
                if other in anchor_of and anchor_of[other] != anchor_of[rule.name]:
                    raise ValueError(
                        f"rule {rule.name!r} outranks {other!r}, which ends at another op: `outranks` orders rules "
                        "ending at the same op (across ops, the match ending later in the graph is taken first)")
        for target, entries in self.by_anchor.items():
            self.by_anchor[target] = _rank(entries)
        produced = {t for r in self.rules for t in r.produces()}
        self.chains = any(_aten(n.target) in produced for r in self.rules for n in r.edge_pattern().ops)


def _rank(entries: list) -> list:
    """Larger patterns first, except that a rule comes before every rule it outranks."""
    todo = sorted(entries, key=lambda e: -e[1].pattern.size)  # stable: table order among equals
    ranked = []
    while todo:
        names = {r.name for r, _ in todo}
        # the first entry that no remaining rule outranks
        free = next((e for e in todo if not any(e[0].name in r.outranks for r, _ in todo if r is not e[0])), None)
        if free is None:
            raise ValueError(f"rules {sorted(names)} outrank each other in a cycle")
        ranked.append(free)
        todo.remove(free)
    return ranked


def _is_edge(m: Match) -> bool:
    # Edge-dialect graphs get backend-dialect handles; anything else plain torch ops. Any matched
    # op tells which: the anchor may be a `getitem` (batch norm's output 0).
    return any(isinstance(n.target, EdgeOpOverload) for n in m.nodes)


def _emit(graph: fx.Graph, m: Match, lookup) -> list[fx.Node]:
    """Insert what replaces match `m` into `graph` (at its insertion point) and return the nodes
    that compute the pattern's outputs, in order. `lookup` maps a node of the matched graph to `graph`'s."""
    edge = _is_edge(m)
    replacement = m.rule.replacement_graph()
    if replacement is None:
        args, kwargs = m.rule.replacement_call(m)
        op = m.rule.replacement
        out = graph.call_function(op.backend if edge else op.aten, fx.map_arg(args, lookup), fx.map_arg(kwargs, lookup))
        out.meta = {**m.anchor.meta, "etfuse": {"rule": m.rule.name, "replaced": [n.name for n in m.nodes]}}
        return [out]
    return _inline(graph, m, replacement, lookup, edge)


def _inline(graph: fx.Graph, m: Match, replacement, lookup, edge: bool) -> list[fx.Node]:
    """Copy a function replacement's lowered graph into `graph`, its parameters bound as the
    pattern's were. Each new node gets its fake value from its inputs' (the replacement was traced
    on example shapes); an output carries the meta of the graph node it stands for, as a backend
    op would."""
    env: dict[fx.Node, Any] = {}
    for p in replacement.graph.nodes:
        if p.op == "placeholder":
            bound = m.bindings[p.name]
            env[p] = lookup(bound) if isinstance(bound, fx.Node) else bound
    info = {"rule": m.rule.name, "replaced": [n.name for n in m.nodes]}
    stands_for = dict(zip(replacement.outputs, m.outputs or [m.anchor]))
    for n in replacement.ops:
        target = _backend_handle(n.target) if edge else _aten(n.target)
        args, kwargs = fx.map_arg(n.args, env.__getitem__), fx.map_arg(n.kwargs, env.__getitem__)
        new = graph.call_function(target, args, kwargs)
        if n in stands_for:
            new.meta = {**stands_for[n].meta, "etfuse": info}
        else:
            new.meta = {"etfuse": info, **_fake_value(m, target, args, kwargs)}
        env[n] = new
    return [env[o] for o in replacement.outputs]


def _backend_handle(target):
    """A catalog op in a lowered replacement (edge dialect after `to_edge`) becomes its backend-dialect
    handle, as a BackendOp replacement's would; other ops stay as lowered."""
    op = _catalog_by_aten().get(_aten(target))
    return op.backend if op is not None else target


@functools.lru_cache(maxsize=1)
def _catalog_by_aten() -> dict:
    from etfuse.backend_ops import CATALOG

    return {op.aten: op for op in CATALOG}


def _fake_value(m: Match, target, args, kwargs) -> dict:
    def val(a):
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    fake_args, fake_kwargs = fx.node.map_aggregate(args, val), fx.node.map_aggregate(kwargs, val)
    try:
        return {"val": target(*fake_args, **fake_kwargs)}
    except Exception as e:  # noqa: BLE001 - re-raised naming the rule and node
        raise FusionError(f"rule {m.rule.name!r}: its replacement's {_op_name(target)} fails on the shapes at node "
                          f"{m.anchor.name!r}: {type(e).__name__}: {e}") from e


def _rewrite(graph: fx.Graph, m: Match, graph_name: str) -> Fused:
    with graph.inserting_before(m.insert_before or m.anchor):
        new = _emit(graph, m, lambda n: n)
    replaced = [n.name for n in m.nodes]
    for old, value in zip(m.outputs or [m.anchor], new):
        old.replace_all_uses_with(value)
    for n in reversed(m.nodes):  # users before producers
        graph.erase_node(n)
    return Fused(m.rule.name, graph_name, _anchor_value(m, new).name, replaced)


def _anchor_value(m: Match, new: list[fx.Node]) -> fx.Node:
    outputs = m.outputs or [m.anchor]
    return new[outputs.index(m.anchor)]


def _insertion_point(m: Match, order: dict) -> Optional[fx.Node]:
    """Where the replacement of `m` can go: the anchor, or, when another output of the pattern is
    used outside the match before the anchor, that first use. None when some input of the match
    is computed only after that point (then it cannot be fused without moving nodes)."""
    inside = set(m.nodes)
    first = m.anchor
    for out in m.outputs:
        for user in out.users:
            if user not in inside and order[user] < order[first]:
                first = user
    inputs = [v for v in m.bindings.values() if isinstance(v, fx.Node)]
    if any(order[v] >= order[first] for v in inputs):
        return None
    return first


def find_matches(graph: fx.Graph, index: RuleIndex, graph_name: str, report: FusionReport,
                 near_misses: bool = False, known_values: Optional[dict] = None) -> list[Match]:
    """One bottom-up sweep: non-overlapping accepted matches, consumers first. Pure: the graph is
    not touched, so a failing constraint leaves everything as it was. With `near_misses`, each
    anchor no rule fused adds the rules that failed there to `report.near_misses`.
    `known_values` ({placeholder name: tensor}) is what `Match.constant` can see of weights."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    candidates = [n for target in index.by_anchor for n in graph.find_nodes(op="call_function", target=target, sort=False)]
    candidates.sort(key=order.__getitem__, reverse=True)
    claimed: set[fx.Node] = set()
    matches: list[Match] = []
    graph_args: dict[fx.Node, list] = {}
    for anchor in candidates:
        if anchor in claimed:
            continue
        missed: list[NearMiss] = []
        for rule, matcher in index.by_anchor[anchor.target]:
            found = matcher.match(anchor, graph_args)
            if found is None:
                if near_misses and matcher.miss is not None:
                    missed.append(_near_miss(rule, graph_name, anchor, matcher))
                continue
            bindings, matched = found
            # pattern order; a stepped-over copy right after its producer (erased users first)
            nodes = [g for p in matcher.pattern.ops for g in (matched[p], matched.get(("after", p))) if g is not None]
            if claimed.intersection(nodes):
                if near_misses:
                    taken = next(n for n in nodes if n in claimed)
                    missed.append(NearMiss(rule.name, graph_name, anchor.name, _op_name(taken.target),
                                           "part of another fusion", f"{taken.name} is already part of another fusion",
                                           matcher.pattern.size, matcher.pattern.size))
                continue
            m = Match(rule, anchor, nodes, bindings, known_values, [matched[p] for p in matcher.pattern.outputs])
            if len(m.outputs) > 1:
                m.insert_before = _insertion_point(m, order)
                if m.insert_before is None:
                    report.declined.append(Declined(rule.name, graph_name, anchor.name,
                                                    "an output of the pattern is used before all of its inputs exist"))
                    continue
            try:
                reason = rule.constraint(m) if rule.constraint else None
            except Exception as e:  # noqa: BLE001 - a broken constraint names itself
                raise FusionError(
                    f"rule {rule.name!r} failed checking node {anchor.name!r} in graph "
                    f"{graph_name or '<top>'}: {type(e).__name__}: {e}"
                ) from e
            if reason:
                report.declined.append(Declined(rule.name, graph_name, anchor.name, reason))
                continue
            claimed.update(nodes)
            matches.append(m)
            break
        else:
            report.near_misses += missed
    return matches


def _near_miss(rule: Rule, graph_name: str, anchor: fx.Node, matcher: _Matcher) -> NearMiss:
    pnode, gvalue, kind, detail = matcher.miss
    why = _why(pnode, gvalue, kind, detail)
    if pnode is None:
        expected = "?"
    elif pnode.op == "placeholder":
        expected = pnode.name
    else:
        expected = _op_name(pnode.target)
    found = f"{_describe(gvalue, False)} with other users" if kind == "users" else _describe(gvalue, False)
    return NearMiss(rule.name, graph_name, anchor.name, expected, found, why,
                    max(matcher._miss_depth, 1), matcher.pattern.size)


def apply_matches(graph: fx.Graph, matches: list[Match], graph_name: str, report: FusionReport) -> None:
    """Rewrite `matches` (from `find_matches` on this same graph) in place."""
    for m in matches:
        report.fused.append(_rewrite(graph, m, graph_name))


def rebuild_with_matches(graph: fx.Graph, matches: list[Match], graph_name: str,
                         report: FusionReport) -> fx.Graph:
    """A new graph equal to `graph` with `matches` (found in `graph`) fused; `graph` is untouched.

    One pass in node order: a match's nodes are skipped and its replacement is emitted where the
    anchor was (or before an earlier outside user of another of its outputs). Copying and
    rewriting together costs one node creation per surviving node.
    """
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    new._codegen = copy.deepcopy(graph._codegen)
    at: dict[fx.Node, list[Match]] = defaultdict(list)
    for m in matches:
        at[m.insert_before or m.anchor].append(m)
    replaced = {n for m in matches for n in m.nodes}
    env: dict[fx.Node, fx.Node] = {}
    lookup = env.__getitem__
    for node in graph.nodes:
        for m in at.get(node, ()):
            values = _emit(new, m, lookup)
            env.update(zip(m.outputs or [m.anchor], values))
            report.fused.append(Fused(m.rule.name, graph_name, _anchor_value(m, values).name, [n.name for n in m.nodes]))
        if node not in replaced:
            env[node] = new.node_copy(node, lookup)
    return new
