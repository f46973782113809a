"""`replace_pattern`: `torch.fx.subgraph_rewriter.replace_pattern_with_filters`, in linear time,
reaching into control-flow bodies.

Same contract as torch 2.13's: pattern and replacement given as callables (traced with
`symbolic_trace`), `Graph`s or `GraphModule`s; match filters called as
`f(InternalMatch, original_graph, pattern_graph)` after overlapping matches are dropped; the same
`ReplacedPatterns` back (`anchor` is the pattern's first anchor, as torch returns it). The same
matches: placeholders match any value, literals compare by type and value unless
`ignore_literals`, an interior node may have no user outside the match, a match whose fusion
would form a cycle is dropped, and of overlapping matches the one `SubgraphMatcher` finds first
(anchor candidates in graph order) is kept. Replacement nodes are inserted and named exactly as
torch inserts and names them, so both produce the same graph.

Why torch is quadratic and this is not: `SubgraphMatcher` scans every node for anchor candidates,
tries every combination of candidates of a multi-anchor pattern, and runs a BFS over everything
downstream of each match (`validate_partition`); the rewriter scans the graph for the first user
of each match. Here candidates come from `graph.find_nodes` by the anchor's target; a later
anchor's candidates are the users, along the pattern's path, of a node the earlier anchors
already matched; the cycle search stops at the match's last node (edges only go forward); the
first user is the least of the users in node order. Work per match is bounded by the match and
its neighbours, except the cycle search of a multi-output match, bounded by the span between its
first outside user and its last node, and the candidates of a later anchor reached only through a
placeholder: the placeholder's users (torch tries the whole graph there).

Control flow: after the graph of `gm`, every nested `GraphModule` (cond branches, loop and scan
bodies) is rewritten too. `gm`'s own graph is rewritten in place, as torch does; a body is never:
it may be shared with another program (executorch copies programs shallowly), so a body with
something to rewrite is copied first, and its parent (copied too, unless it is `gm`) points at the
copy. A body used under two names stays one (copied) module. A body's match filters see the body's
graph as it was before the copy (the same nodes, the same values).

Differences from torch, all where torch fails or loses work: a pattern whose anchor has no
candidate finds nothing (torch raises KeyError when the other anchors match); a match in which
`ignore_literals` let a pattern op stand for a literal is dropped (torch raises KeyError while
rewriting); submodules are not garbage-collected after a `GraphModule` replacement (torch's
`delete_all_unused_submodules` deletes the bodies nested inside control-flow bodies).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.subgraph_rewriter import ReplacedPatterns

MatchFilter = Callable[[InternalMatch, fx.Graph, fx.Graph], bool]
PatternLike = Union[Callable[..., Any], fx.Graph, fx.GraphModule]

__all__ = ["replace_pattern", "replace_patterns", "ReplacedPatterns", "InternalMatch"]


def replace_pattern(gm: fx.GraphModule, pattern: PatternLike, replacement: PatternLike,
                    match_filters: Optional[Sequence[MatchFilter]] = None,
                    ignore_literals: bool = False) -> list[ReplacedPatterns]:
    """`subgraph_rewriter.replace_pattern_with_filters(gm, pattern, replacement, match_filters,
    ignore_literals)`, linear in the graph, applied to `gm`'s graph and every control-flow body
    (see the module docstring). Returns the replacements, `gm`'s graph first, then the bodies."""
    return replace_patterns(gm, [(pattern, replacement, match_filters)], ignore_literals)[0]


def replace_patterns(gm: fx.GraphModule,
                     patterns: Sequence[tuple[PatternLike, PatternLike, Optional[Sequence[MatchFilter]]]],
                     ignore_literals: bool = False, *, recompile: bool = True) -> list[list[ReplacedPatterns]]:
    """`replace_pattern` for each `(pattern, replacement, match_filters)` in list order, the same
    as calling it once per entry, with each pattern and replacement traced once for the whole
    program and each rewritten graph module recompiled once. Returns one list of replacements
    per entry. `recompile=False` leaves the recompiling (regenerating `gm.code` and `forward`:
    seconds at 16,000 nodes) to the caller, for a pipeline whose next step recompiles anyway."""
    prepared = [_Rewrite(_Pattern(p, ignore_literals), r, list(f or [])) for p, r, f in patterns]
    results: list[list[ReplacedPatterns]] = [[] for _ in prepared]
    _rewrite_module(gm, prepared, results, is_top=True, done={}, recompile=recompile)
    return results


# --- the pattern ---------------------------------------------------------------------------------


class _Pattern:
    """A pattern graph with what matching needs: anchors (returned nodes whose only user is the
    output, as `SubgraphMatcher` picks them), placeholders, returned nodes, and for each later
    anchor a path from a node an earlier anchor reaches."""

    def __init__(self, pattern: PatternLike, ignore_literals: bool):
        if isinstance(pattern, fx.GraphModule):
            graph = pattern.graph
        elif isinstance(pattern, fx.Graph):
            graph = pattern
        else:
            graph = fx.symbolic_trace(pattern).graph
        if len(graph.nodes) == 0:
            raise ValueError("SubgraphMatcher cannot be initialized with an empty pattern")
        for n in graph.nodes:
            if n.op != "output" and not n.is_impure() and len(n.users) == 0:
                raise AssertionError("SubgraphMatcher cannot be initialized with an pattern with dead code")
        self.graph = graph
        self.ignore_literals = ignore_literals
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        output = next(iter(reversed(graph.nodes)))
        self.returning = output.all_input_nodes
        self.returning_set = set(self.returning)
        self.anchors = [n for n in self.returning if len(n.users) == 1]
        self.ops = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
        self._spelled = {n: [*n.args, *n.kwargs.values()] for n in self.ops}  # args as written
        first = self.anchors[0] if self.anchors else None
        self._first_inputs = None  # see `_may_match`
        if first is not None and first.op == "call_function" and not first.kwargs and not ignore_literals:
            self._first_inputs = [a.target if isinstance(a, fx.Node) and a.op == "call_function" else None
                                  for a in first.args]
        # For anchor i > 0: (a pattern node reached from anchors < i, the path from it to anchor i)
        self.paths: list[Optional[list[fx.Node]]] = [None]
        reached: set[fx.Node] = set()
        for i, anchor in enumerate(self.anchors):
            if i:
                self.paths.append(None if ignore_literals else _path_from(reached, anchor))
            reached |= _ancestors(anchor)

    # -- matching (pure: reads the graph, never changes it) --

    def matches(self, graph: fx.Graph) -> list[InternalMatch]:
        """The non-overlapping matches `SubgraphMatcher(match_output=False,
        match_placeholder=False, remove_overlapping_matches=True).match(graph)` returns, in its
        order."""
        if not self.anchors:
            return []
        candidates = [self._candidates(graph, a) for a in self.anchors]
        if not all(candidates):
            return []  # torch: KeyError once the other anchors match; nothing can match
        claimed: set[fx.Node] = set()
        out: list[InternalMatch] = []
        for gn in candidates[0]:
            if gn in claimed and self.anchors[0].op != "placeholder":
                continue  # every match at gn overlaps an earlier one
            if not self._may_match(gn):
                continue
            nodes_map: dict = {}
            if not self._match_node(self.anchors[0], gn, nodes_map, _used(nodes_map)):
                continue
            found = self._complete(candidates, 1, nodes_map, claimed)
            if found is not None:
                out.append(found)
                claimed.update(v for k, v in found.nodes_map.items() if k.op != "placeholder")
        return out

    def _may_match(self, gn: fx.Node) -> bool:
        """A cheap necessary condition, checked before a match is built: where the first anchor's
        arguments are spelled as the pattern's, each argument the pattern computes with an op is
        a node with that op (most candidates fail here)."""
        wanted = self._first_inputs
        if wanted is None or len(gn.args) != len(wanted) or gn.kwargs:
            return True
        for g, target in zip(gn.args, wanted):
            if target is not None and not (isinstance(g, fx.Node) and g.op == "call_function" and g.target == target):
                return False
        return True

    def _complete(self, candidates: list, i: int, nodes_map: dict, claimed: set) -> Optional[InternalMatch]:
        """The first acceptable match extending `nodes_map` (anchors < i matched), trying anchor
        i's candidates in graph order, as torch's backtracking does."""
        if i == len(self.anchors):
            if not self._acceptable(nodes_map, claimed):
                return None
            return InternalMatch(
                anchors=self.anchors, nodes_map=nodes_map,
                placeholder_nodes=[nodes_map[p] for p in self.placeholders],
                returning_nodes=[nodes_map[p] for p in self.returning])
        anchor = self.anchors[i]
        for gn in self._later_candidates(candidates[i], i, nodes_map):
            if gn in claimed and anchor.op != "placeholder":
                continue
            trial = dict(nodes_map)
            if self._match_node(anchor, gn, trial, _used(trial)):
                found = self._complete(candidates, i + 1, trial, claimed)
                if found is not None:
                    return found
        return None

    def _candidates(self, graph: fx.Graph, anchor: fx.Node) -> list[fx.Node]:
        if anchor.op == "placeholder":
            return list(graph.nodes)  # a placeholder anchor matches anything
        if anchor.op == "call_function":
            return graph.find_nodes(op="call_function", target=anchor.target)
        if anchor.op == "get_attr":  # any constant tensor matches, whatever its name
            return [n for n in graph.find_nodes(op="get_attr") if self._same_op(anchor, n)]
        return graph.find_nodes(op=anchor.op, target=anchor.target)

    def _later_candidates(self, everywhere: list[fx.Node], i: int, nodes_map: dict) -> list[fx.Node]:
        """Anchor i's candidates that can extend `nodes_map` (`everywhere`: all of them)."""
        path = self.paths[i]
        start = nodes_map.get(path[0]) if path else None
        if not isinstance(start, fx.Node):
            return everywhere
        # A match maps each pattern edge onto a graph edge, so anchor i's node is a user of a
        # user ... of `start` along `path`, each with the pattern node's op and target.
        frontier = {start: None}
        for pn in path[1:]:
            frontier = {u: None for g in frontier for u in g.users if self._same_op(pn, u)}
        return sorted(frontier)

    def _acceptable(self, nodes_map: dict, claimed: set) -> bool:
        inside = {gn: pn for pn, gn in nodes_map.items() if pn.op != "placeholder"}
        if len(inside) < len(self.ops):
            return False  # ignore_literals let a pattern op stand for a literal (torch: KeyError)
        if any(gn in claimed for gn in inside):
            return False
        outside_users = []
        for gn, pn in inside.items():
            for u in gn.users:
                if u not in inside:
                    if pn not in self.returning_set:
                        return False  # an interior value used outside the match
                    outside_users.append(u)
        return not _forms_cycle(inside, outside_users)

    def _same_op(self, pn: fx.Node, gn: fx.Node) -> bool:
        if pn.op == "placeholder":
            return True
        if pn.op != gn.op:
            return False
        if pn.op == "output":
            return True
        if pn.op == "get_attr":
            return _same_attribute(pn, gn)
        return pn.target == gn.target

    def _match_node(self, pn: fx.Node, gn: fx.Node, nodes_map: dict, used: set) -> bool:
        """`SubgraphMatcher._match_nodes`. A failure anywhere fails the whole anchor attempt
        (torch tries no alternative below an anchor), so `nodes_map` need not be restored."""
        if pn in nodes_map:
            return nodes_map[pn] == gn
        if gn in used:
            return False  # two pattern nodes never share a graph node, so `a + b` misses `x + x`
        if not self._same_op(pn, gn):
            return False
        nodes_map[pn] = gn
        used.add(gn)
        if pn.op == "placeholder":
            return True
        if len(pn.args) == len(gn.args) and list(pn.kwargs) == list(gn.kwargs):
            pargs, gargs = self._spelled[pn], [*gn.args, *gn.kwargs.values()]
        else:
            pargs, gargs = _flat_args(pn, gn)
        return pargs is not None and self._match_args(pargs, gargs, nodes_map, used)

    def _match_args(self, pargs, gargs, nodes_map: dict, used: set) -> bool:
        if len(pargs) != len(gargs):
            return False
        for p, g in zip(pargs, gargs):
            if isinstance(p, fx.Node) and isinstance(g, fx.Node):
                ok = self._match_node(p, g, nodes_map, used)
            elif isinstance(p, (list, tuple)) and isinstance(g, (list, tuple)):
                ok = self._match_args(p, g, nodes_map, used)
            else:
                ok = _match_literal(p, g, nodes_map) or self.ignore_literals
            if not ok:
                return False
        return True


def _used(nodes_map: dict) -> set:
    """The graph nodes a partial match already holds (torch: `gn in nodes_map.values()`)."""
    return {v for v in nodes_map.values() if isinstance(v, fx.Node)}


def _match_literal(p, g, nodes_map: dict) -> bool:
    """`SubgraphMatcher._match_literals`: a placeholder binds any value; literals equal in type
    and value (1 is not 1.0, True is not 1)."""
    if isinstance(p, fx.Node):
        if p.op != "placeholder":
            return False
        if p in nodes_map:
            return nodes_map[p] == g
        nodes_map[p] = g
        return True
    if isinstance(g, fx.Node):
        return False
    return type(g) is type(p) and g == p


def _flat_args(pn: fx.Node, gn: fx.Node):
    """Both nodes' args and kwargs as two lists compared position by position, as torch compares
    them: through the op's schema when their spellings differ (then defaults fill in)."""
    same_spelling = len(pn.args) == len(gn.args) and list(pn.kwargs) == list(gn.kwargs)
    if not same_spelling and pn.op == "call_function" and isinstance(pn.target, torch._ops.OpOverload):
        schema = pn.target._schema.arguments

        def by_schema(args, kwargs):
            out = []
            for i, a in enumerate(schema):
                if a.name in kwargs:
                    out.append(kwargs[a.name])
                elif not a.kwarg_only and i < len(args):
                    out.append(args[i])
                else:
                    out.append(a.default_value)
            return out

        return by_schema(pn.args, pn.kwargs), by_schema(gn.args, gn.kwargs)
    if same_spelling:
        return [*pn.args, *pn.kwargs.values()], [*gn.args, *gn.kwargs.values()]
    return None, None


def _same_attribute(pn: fx.Node, gn: fx.Node) -> bool:
    """`SubgraphMatcher._match_attributes`: constant tensors match any tensor."""
    pv = functools.reduce(getattr, pn.target.split("."), pn.graph.owning_module)
    gv = functools.reduce(getattr, gn.target.split("."), gn.graph.owning_module)
    if type(pv) is not type(gv):
        return False
    if isinstance(pv, torch.Tensor):
        return True
    raise RuntimeError(f"Unsupported type {pv} when matching attributes")


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def _path_from(sources: set[fx.Node], anchor: fx.Node) -> Optional[list[fx.Node]]:
    """The shortest pattern path `[source, ..., anchor]` from a node in `sources` (preferring one
    that is not a placeholder: an op's users in the graph are few, a placeholder's may be many)."""
    best = None
    for prefer_ops in (True, False):
        parent = {anchor: None}
        todo = [anchor]
        while todo and best is None:
            nxt = []
            for n in todo:
                for a in n.all_input_nodes:
                    if a in parent:
                        continue
                    parent[a] = n
                    if a in sources and (a.op != "placeholder" or not prefer_ops):
                        best = a
                        break
                    nxt.append(a)
                if best is not None:
                    break
            todo = nxt
        if best is not None:
            path = [best]
            while path[-1] is not anchor:
                path.append(parent[path[-1]])
            return path
    return None


def _forms_cycle(inside: dict, outside_users: list) -> bool:
    """`validate_partition`: would fusing `inside` form a cycle, i.e. does a path leave the match
    and come back? Edges go forward in node order, so the search stops at the match's last node."""
    if not outside_users:
        return False
    last = max(inside)
    seen: set[fx.Node] = set()
    todo = [u for u in outside_users if u < last]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in inside:
            return True
        todo.extend(u for u in n.users if u not in seen and not u > last)
    return False


# --- rewriting -----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Rewrite:
    pattern: _Pattern
    replacement: PatternLike
    filters: list
    _graph: Optional[fx.Graph] = None

    @property
    def replacement_graph(self) -> fx.Graph:
        if self._graph is None:  # traced once, on the first match
            r = self.replacement
            if isinstance(r, fx.GraphModule):
                self._graph = r.graph
            elif isinstance(r, fx.Graph):
                self._graph = r
            elif callable(r):
                self._graph = fx.symbolic_trace(r).graph
            else:
                raise AssertionError("Must provide either a replacement GraphModule or a replacement callback")
        return self._graph


def _rewrite_module(m: fx.GraphModule, rewrites: list[_Rewrite], results: list[list], is_top: bool,
                    done: dict, recompile: bool) -> fx.GraphModule:
    """Rewrite `m` (in place if `is_top`, else on a copy made when there is something to rewrite)
    and its nested graph modules; returns the module its parent should hold."""
    current, changed = m, False
    for k, rw in enumerate(rewrites):
        matches = rw.pattern.matches(current.graph)
        matches = [x for x in matches if all(f(x, current.graph, rw.pattern.graph) for f in rw.filters)]
        if not matches:
            continue
        if current is m and not is_top:
            current, env = _copy_module(m)
            matches = [_moved(x, env) for x in matches]
        results[k] += _apply(current, matches, rw)
        changed = True
    # every name a child is held under (`named_children` lists a shared child once)
    children = [(n, c) for n, c in m.named_modules(remove_duplicate=False) if n and "." not in n]
    for name, child in children:
        if not isinstance(child, fx.GraphModule):
            continue
        if id(child) not in done:
            done[id(child)] = _rewrite_module(child, rewrites, results, False, done, recompile)
        new = done[id(child)]
        if new is not child:
            if current is m and not is_top:
                current, _ = _copy_module(m)
            setattr(current, name, new)
    if changed and not is_top:  # a body copy is new: nothing else recompiles it
        current.recompile()
    elif changed and recompile:
        recompile_lazily(current)  # once for all the patterns
    return current


def recompile_lazily(gm: fx.GraphModule) -> None:
    """`gm.recompile()`, done when first needed: on the first call, `gm.code` or `str(gm)`.

    Regenerating a module's Python code costs as much as the whole rewrite of a 10,000-node graph,
    and most callers never run it: executorch's passes and `to_executorch` read `gm.graph`. This is
    what torch's own `_LazyGraphModule` does (its `recompile` only swaps `forward` for a stub that
    recompiles), applied to the module in hand: every `GraphModule` has a class of its own, so
    the stub and the `code` property set here touch no other module. A module of any other
    shape is recompiled at once."""
    cls = type(gm)
    if isinstance(gm, _LazyGraphModule):
        gm.recompile()  # lazy already
        return
    if not cls.__qualname__.endswith("GraphModuleImpl") or cls.__mro__[1] is not fx.GraphModule or "forward" in vars(gm):
        gm.recompile()
        return
    cls.forward = _lazy_forward
    cls.code = property(_recompiled_first(fx.GraphModule.code.fget))
    for name in ("__str__", "__reduce__", "__reduce_package__"):  # these read the stored code
        setattr(cls, name, _recompiled_first(getattr(fx.GraphModule, name)))


def _needs_recompile(gm: fx.GraphModule) -> bool:
    return type(gm).forward is _lazy_forward  # a real recompile installs the generated forward


def _lazy_forward(self, *args, **kwargs):
    fx.GraphModule.recompile(self)
    return self(*args, **kwargs)  # through `__call__`, which the recompile may have wrapped


def _recompiled_first(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if _needs_recompile(self):
            fx.GraphModule.recompile(self)
        return method(self, *args, **kwargs)

    return wrapper


def _copy_module(m: fx.GraphModule) -> tuple[fx.GraphModule, dict]:
    env: dict[fx.Node, fx.Node] = {}
    graph = fx.Graph(tracer_cls=m.graph._tracer_cls)
    graph._codegen = copy.deepcopy(m.graph._codegen)
    for n in m.graph.nodes:
        env[n] = graph.node_copy(n, env.__getitem__)
    new = fx.GraphModule(m, graph, class_name=type(m).__name__)
    new.meta.update(m.meta)
    return new, env


def _moved(match: InternalMatch, env: dict) -> InternalMatch:
    def mv(v):
        return env[v] if isinstance(v, fx.Node) else v

    return InternalMatch(anchors=match.anchors, nodes_map={k: mv(v) for k, v in match.nodes_map.items()},
                         placeholder_nodes=[mv(v) for v in match.placeholder_nodes],
                         returning_nodes=[mv(v) for v in match.returning_nodes])


def _apply(gm: fx.GraphModule, matches: list[InternalMatch], rw: _Rewrite) -> list[ReplacedPatterns]:
    """The rewriting half of torch's `_replace_pattern`, step for step (same insertion points,
    same node names), with the graph scans replaced by node-order comparisons."""
    graph = gm.graph
    replacement_graph = rw.replacement_graph
    replacement_placeholders = [n for n in replacement_graph.nodes if n.op == "placeholder"]
    changed: dict[fx.Node, fx.Node] = {}  # a returned node of an earlier match -> its replacement
    out = []
    for match in matches:
        if len(match.placeholder_nodes) != len(replacement_placeholders):
            raise AssertionError(f"Placeholder count mismatch: {len(match.placeholder_nodes)} vs "
                                 f"{len(replacement_placeholders)}")
        val_map: dict = {}
        for rn, gn in zip(replacement_placeholders, match.placeholder_nodes):
            if isinstance(gn, fx.Node):
                val_map[rn] = changed.get(gn, gn)
                if gn is not val_map[rn]:
                    # the input was replaced by an earlier match: point the match at the new node
                    i = match.placeholder_nodes.index(gn)
                    match.placeholder_nodes[i] = changed[gn]
                    key = list(match.nodes_map)[list(match.nodes_map.values()).index(gn)]
                    match.nodes_map[key] = changed[gn]
            else:
                val_map[rn] = gn
        users = {u: None for n in match.returning_nodes for u in n.users}
        if users:
            insert_point = min(users)  # the first user in node order
        else:
            insert_point = max(match.returning_nodes).next
        with graph.inserting_before(insert_point):
            copied = graph.graph_copy(replacement_graph, val_map)
        if isinstance(copied, fx.Node):
            copied = (copied,)
        new_nodes = [v for v in val_map.values() if v not in match.placeholder_nodes]
        if len(match.returning_nodes) != len(copied):
            raise AssertionError(f"Returning nodes count mismatch: {len(match.returning_nodes)} vs {len(copied)}")
        for gn, cn in zip(match.returning_nodes, copied):
            gn.replace_all_uses_with(cn)
            changed[gn] = cn
        for pn in reversed(rw.pattern.graph.nodes):
            if pn.op != "placeholder" and pn.op != "output":
                graph.erase_node(match.nodes_map[pn])
        out.append(ReplacedPatterns(anchor=match.anchors[0], nodes_map=match.nodes_map, replacements=new_nodes))
        if isinstance(rw.replacement, torch.nn.Module):
            _copy_attributes(gm, rw.replacement, new_nodes)
    return out


def _copy_attributes(gm: fx.GraphModule, replacement: torch.nn.Module, new_nodes: list) -> None:
    """Submodules and attributes the new nodes use that `gm` lacks come from the replacement
    (torch's `_replace_attributes`, for the new nodes only)."""
    for n in new_nodes:
        if not isinstance(n, fx.Node) or n.op not in ("call_module", "get_attr"):
            continue
        if _try_get_attr(gm, n.target) is not None:
            continue
        value = _try_get_attr(replacement, n.target)
        if value is None:
            raise RuntimeError(f"Attempted to create a {n.op!r} node during subgraph rewriting with target "
                               f"{n.target}, but the referenced attribute does not exist in the replacement GraphModule")
        value = copy.deepcopy(value)
        if isinstance(value, torch.nn.Module):
            gm.add_submodule(n.target, value)
        else:
            setattr(gm, n.target, value)


def _try_get_attr(m: torch.nn.Module, target: str):
    path, _, name = target.rpartition(".")
    try:
        owner = m.get_submodule(path)
    except AttributeError:
        return None
    return getattr(owner, name, None)
