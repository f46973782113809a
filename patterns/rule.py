"""A fusion rule is data: an ATen pattern, what replaces it (a backend op, or any function of
ops), and a constraint.

Rules are written once with ATen ops. `edge_pattern()` exports the pattern and runs it through
`to_edge` (trace.py; once per rule and process, `edge_patterns(rules)` traces many in one export),
so it matches edge-dialect graphs exactly as the user's program was lowered
(`aten.linear` becomes `permute_copy -> addmm`, constants are lifted, ...). A pattern that can
never match an edge graph is a `PatternError` when it is lowered, not a silent no-op.

A replacement that is a function (not one `BackendOp`) is exported and lowered the same way, with
the same example inputs and the same parameters (scalars and `QuantRule` dtypes included), and the
engine inlines its graph at the match (`Rule.replacement_graph()`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Union

import torch
import torch.fx as fx

from etfuse.backend_ops import BackendOp
from etfuse.errors import EtfuseError


# meta key of a placeholder whose real value `etfuse.fuse` knows (a weight, a lifted constant):
# graph-module passes see only fake tensors otherwise
CONSTANT_VALUE = "etfuse_constant_value"


class _AnySizes:
    """A size list of a `free_sizes` rule's view/expand: matches any literal list."""

    def __repr__(self):
        return "ANY_SIZES"


ANY_SIZES = _AnySizes()


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
    # the graph nodes of the pattern's outputs, in the pattern's order (the anchor is one of them)
    outputs: list[fx.Node] = dataclasses.field(default_factory=list)
    # where the replacement goes: the anchor, or an earlier outside user of another output
    insert_before: Optional[fx.Node] = None

    def value(self, name: str):
        """The bound value: `meta["val"]` (a fake tensor or SymInt) for nodes, else the literal."""
        bound = self.bindings[name]
        return bound.meta.get("val") if isinstance(bound, fx.Node) else bound

    @property
    def anchor_value(self):
        return self.anchor.meta.get("val")

    def constant(self, name: str) -> Optional[torch.Tensor]:
        """The real tensor bound to parameter `name` when the program knows it (a constant the
        fake tensor carries, a `get_attr` of the graph's module, a placeholder in the pass's
        `node_value_dict` or one `etfuse.fuse` gave its value), else None. For constraints that
        depend on weight values."""
        bound = self.bindings.get(name)
        if not isinstance(bound, fx.Node):
            return bound if isinstance(bound, torch.Tensor) else None
        if bound.op == "get_attr":
            owner = bound.graph.owning_module
            value = getattr(owner, str(bound.target), None) if owner is not None else None
            return value if isinstance(value, torch.Tensor) else None
        if bound.op == "placeholder":
            if self.known_values and bound.name in self.known_values:
                return self.known_values[bound.name]
            if CONSTANT_VALUE in bound.meta:
                return bound.meta[CONSTANT_VALUE]
        return getattr(bound.meta.get("val"), "constant", None)


Constraint = Callable[[Match], Optional[str]]  # returns why the match is declined, or None


@dataclasses.dataclass(eq=False)
class EdgePattern:
    graph: fx.Graph
    params: list[str]  # pattern parameter names, in placeholder order
    anchor: fx.Node  # the pattern's last op: where matching starts
    ops: list[fx.Node]  # call_function nodes in topological order
    # what the pattern returns, in order; a pattern with several outputs returns nodes the anchor
    # depends on (they may have users outside a match)
    outputs: list[fx.Node] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [self.anchor]

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
    Scalar parameters are found in the lowered graphs by their example value, so each needs a
    value that no other scalar parameter and no literal of the pattern or replacement has.
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
    # The sizes of the pattern's view_copy / expand_copy (which export bakes from the example
    # shapes) match any sizes. The constraint must then check the matched nodes' shapes.
    free_sizes: bool = False
    # Ops the match steps over between two pattern ops (value-preserving copies, e.g. the
    # `_clone_dim_order` export puts after an expand of a non-contiguous tensor): they may or may
    # not be there, and are removed with the match.
    skips: tuple = ()

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
            self._store_replacement(_traced([self], replacements=True)[self])
        return _TRACED_REPLACEMENTS[self]

    def _store_replacement(self, traced: EdgePattern) -> None:
        traced = self.bind_literals(traced, replacement=True)
        wanted = len(self.edge_pattern().outputs)
        if len(traced.outputs) != wanted:
            raise PatternError(f"rule {self.name!r}: the pattern returns {wanted} value(s) and the replacement "
                               f"{len(traced.outputs)}; they must return as many, in the same order")
        _TRACED_REPLACEMENTS[self] = traced

    def produces(self) -> list:
        """The ATen overloads the replacement puts into a graph."""
        if isinstance(self.replacement, BackendOp):
            return [self.replacement.aten]
        return [getattr(n.target, "_op", n.target) for n in self.replacement_graph().ops]

    def edge_pattern(self) -> EdgePattern:
        """The pattern as an edge-dialect graph (traced once per rule and process; `edge_patterns`
        traces many rules at once)."""
        if self not in _TRACED:
            _TRACED[self] = self._checked(self.bind_literals(_traced([self])[self]))
        return _TRACED[self]

    def _checked(self, traced: EdgePattern) -> EdgePattern:
        if len(traced.outputs) > 1 and isinstance(self.replacement, BackendOp):
            raise PatternError(f"rule {self.name!r}: the pattern returns {len(traced.outputs)} values but a BackendOp "
                               "returns one; use a function replacement that returns as many")
        return traced

    def bind_literals(self, traced: EdgePattern, replacement: bool = False) -> EdgePattern:
        """Turn literals the rule treats as parameters into placeholders (scalars already are).
        `replacement`: `traced` is the replacement's graph, which may leave parameters unused."""
        if self.free_sizes and not replacement:
            for n in traced.ops:
                if getattr(n.target, "_op", n.target) in _SIZED_OPS:
                    n.args = (n.args[0], ANY_SIZES, *n.args[2:])
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


_SIZED_OPS = (torch.ops.aten.view_copy.default, torch.ops.aten.expand_copy.default)

_TRACED: dict["Rule", EdgePattern] = {}  # Rule.edge_pattern's cache (rules hash by identity)
_TRACED_REPLACEMENTS: dict["Rule", EdgePattern] = {}  # Rule.replacement_graph's cache


def edge_patterns(rules) -> list[EdgePattern]:
    """`rule.edge_pattern()` for each rule, the ones not traced yet traced together; their function
    replacements too (one more export), so preparing a rule table costs two exports, not one per rule."""
    rules = list(rules)
    todo = [r for r in dict.fromkeys(rules) if r not in _TRACED]
    if len(todo) > 1:
        for rule, traced in _traced(todo, batch=True).items():
            _TRACED[rule] = rule._checked(rule.bind_literals(traced))
    patterns = [r.edge_pattern() for r in rules]
    todo = [r for r in dict.fromkeys(rules) if not isinstance(r.replacement, BackendOp) and r not in _TRACED_REPLACEMENTS]
    if len(todo) > 1:
        for rule, traced in _traced(todo, replacements=True, batch=True).items():
            rule._store_replacement(traced)
    return patterns


def _traced(rules, replacements: bool = False, batch: bool = False) -> dict:
    from .trace import traced  # the tracing needs export and to_edge: imported when a rule is first traced

    return traced(rules, replacements, batch)
