"""SymIntToPrimsPass: Python SymInt/SymFloat/SymBool builtins -> `executorch_prim` backend ops.

A program exported with dynamic shapes keeps its shape arithmetic as calls of Python builtins
(`operator.floordiv`, `math.floor`, `torch.sym_max`, ...). The ExecuTorch emitter knows some of
them and rejects the rest; the runtime's prim kernels differ from Python in places (`%` takes
the sign of the dividend, `round` rounds half away from zero). This pass rewrites every such
call, in the top graph and in every control-flow body, into `executorch_prim` ops that the
runtime runs *and* that give exactly what Python gives, composing where the kernel differs:

| Python                     | executorch_prim                                               |
|----------------------------|---------------------------------------------------------------|
| a + b, a - b, a * b, -a    | add, sub, mul, neg                                            |
| a / b, float(a)            | truediv, sym_float                                            |
| a // b  (ints)             | floordiv (floors like Python)                                 |
| a % b   (ints)             | a - (a // b) * b                                              |
| ==, >, <, >=, <=           | kept as Python comparisons: executorch maps them to eq, gt, lt, ge, le after its replay (a bool-returning prim in an edge graph specialises the program, see backend_ops/prims.py) |
| not a, torch.sym_not(a)    | sym_ite(a, False, True)                                       |
| a != b                     | sym_ite(a == b, False, True)                                  |
| abs(a)                     | sym_ite(le(a, 0), sub(0, a), a)                               |
| a ** k  (int a, const k>=0)| square-and-multiply with mul                                  |
| a & b, a | b  (bools)      | sym_ite(a, b, False), sym_ite(a, True, b)                     |
| a & c, a | c  (int, const) | bits of c: ((a // 2^i) - (a // 2^(i+1)) * 2) * 2^i summed     |
| a << k, a >> k  (const k)  | a * 2^k, a // 2^k                                             |
| math.floor(x)              | -ceil(-x)                                                     |
| math.ceil, math.trunc, int | ceil, trunc                                                   |
| round(x)                   | round (the runtime rounds half to even, like Python)          |
| sym_max/min/ite            | sym_max, sym_min, sym_ite                                     |
| torch.sym_sum(xs)          | add chain                                                     |

Integer-valued operands of `math.floor/ceil/trunc`, `round`, `int` are returned unchanged.
Anything else on symbolic values (a shift by a symbolic amount, `a & b` of two symbolic ints,
a float `%` or `//`, `round(x, n)`, `math.sqrt`, ...) is a `SymIntLoweringError` naming the node,
its graph and why. The pass never modifies the graph module it is given.

Upstream (executorch 1.5.1): `to_executorch` rejects `operator.pow/lshift/and_/or_/ne/abs` and
`math.floor` on symbolic values, the edge verifier rejects `torch.sym_max/sym_min/sym_float/
sym_not`, and the runtime's `mod.Scalar` is C's `%`. Delete this module when executorch emits
every builtin exactly (tests/test_compat.py shows a rejected one).
"""

from __future__ import annotations

__all__ = ["SymIntToPrimsPass", "SymIntLoweringError", "LOWERINGS"]

import builtins
import copy
import math
import operator
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from executorch.exir.pass_base import ExportPass, PassResult

from etfuse.backend_ops import install
from etfuse.backend_ops.prims import BOOL_RESULT_EDGE_FORM, PRIMS, sym_ite
from etfuse.errors import EtfuseError
from ..graph_copy import copy_graph, copy_graph_module, graph_modules, unchanged


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PRIM_NAME = {**{p.backend: p.name for p in PRIMS.values()}, **{p.aten: p.name for p in PRIMS.values()}}
_PRIM_TARGETS = set(_PRIM_NAME)


class SymIntLoweringError(EtfuseError, RuntimeError):
    """A symbolic scalar operation has no exact lowering to the runtime's prim ops."""


class _Decline(Exception):
    """Raised by a lowering: the operands are of a kind it cannot lower exactly (the message says why)."""


def _kind(v) -> str:
    if isinstance(v, (bool, torch.SymBool)):
        return "bool"
    if isinstance(v, (int, torch.SymInt)):
        return "int"
    if isinstance(v, (float, torch.SymFloat)):
        return "float"
    raise _Decline(f"operand {v!r} is not an int, float or bool")


class _Builder:
    """Emits prim nodes into `graph`; values are fx nodes or Python literals."""

    def __init__(self, graph: fx.Graph, edge: bool):
        self.graph = graph
        self.edge = edge

    def materialize(self, literal, anchor: Optional[fx.Node]):
        """A node holding `literal` (a folded result still needs a node: outputs are nodes)."""
        if anchor is None:
            return literal
        same = self.graph.call_function(operator.eq, (anchor, anchor))
        same.meta["val"] = True
        node = self.graph.call_function(PRIMS["sym_ite"].backend if self.edge else PRIMS["sym_ite"].aten,
                                        (same, literal, literal))
        node.meta["val"] = literal
        return node

    def val(self, x):
        if not isinstance(x, fx.Node):
            return x
        if "val" not in x.meta:
            raise _Decline(f"operand {x.name!r} has no meta['val'] (a pass before this one dropped it)")
        return x.meta["val"]

    def kind(self, x) -> str:
        return _kind(self.val(x))

    def prim(self, name: str, *args):
        if name == "sym_not":
            return self.prim("sym_ite", args[0], False, True)
        p = PRIMS[name]
        vals = [self.val(a) for a in args]
        value = p.pattern(*vals)
        if not any(isinstance(a, fx.Node) for a in args):
            return value  # all literals: fold
        target = BOOL_RESULT_EDGE_FORM.get(name) or (p.backend if self.edge else p.aten)
        node = self.graph.call_function(target, tuple(args))
        node.meta["val"] = value
        return node

    # Compositions, each exact for the operand kinds it accepts.
    def floordiv(self, a, b):
        if self.kind(a) == "int" and self.kind(b) == "int":
            return self.prim("floordiv", a, b)
        raise _Decline("float floor division has no exact runtime prim (the runtime divides in doubles)")

    def mod(self, a, b):
        if self.kind(a) in ("int", "bool") and self.kind(b) in ("int", "bool"):
            return self.prim("sub", a, self.prim("mul", self.prim("floordiv", a, b), b))
        raise _Decline("float modulo has no exact runtime prim")

    def floor(self, x):
        if self.kind(x) != "float":
            return x
        return self.prim("neg", self.prim("ceil", self.prim("neg", x)))

    def ceil(self, x):
        return x if self.kind(x) != "float" else self.prim("ceil", x)

    def trunc(self, x):
        return x if self.kind(x) != "float" else self.prim("trunc", x)

    def round(self, x, ndigits=None):
        if ndigits is not None:
            raise _Decline("round(x, ndigits) is not lowered (only round(x))")
        return x if self.kind(x) != "float" else self.prim("round", x)  # the runtime rounds half to even

    def ne(self, a, b):
        return self.prim("sym_not", self.prim("eq", a, b))

    def abs(self, a):
        if self.kind(a) == "bool":
            raise _Decline("abs of a bool")
        zero = 0.0 if self.kind(a) == "float" else 0
        return self.prim("sym_ite", self.prim("le", a, zero), self.prim("sub", zero, a), a)

    def pow(self, a, k):
        if isinstance(k, fx.Node):
            raise _Decline("the exponent must be a constant")
        if not isinstance(k, int) or isinstance(k, bool):
            raise _Decline(f"exponent {k!r}: only a constant int exponent is lowered exactly")
        if self.kind(a) == "float" and k not in (0, 1):
            raise _Decline("float ** k rounds differently from repeated multiplication; only k in (0, 1)")
        if k < 0:
            raise _Decline("a negative exponent gives a float (libm pow); only k >= 0 is exact")
        if k == 0:
            return 1.0 if self.kind(a) == "float" else 1
        result, base = None, a
        while k:
            if k & 1:
                result = base if result is None else self.prim("mul", result, base)
            k >>= 1
            if k:
                base = self.prim("mul", base, base)
        return result

    def _bits_and(self, a, c: int):
        """a & c for a symbolic int a and a constant int c (Python's infinite two's complement)."""
        if c < 0:
            return self.prim("sub", a, self._bits_and(a, ~c))
        total = 0
        i = 0
        while c >> i:
            if (c >> i) & 1:
                lo = self.prim("floordiv", a, 1 << i)
                hi = self.prim("floordiv", a, 1 << (i + 1))
                bit = self.prim("sub", lo, self.prim("mul", hi, 2))
                term = self.prim("mul", bit, 1 << i)
                total = term if isinstance(total, int) and total == 0 else self.prim("add", total, term)
            i += 1
        return total

    def and_(self, a, b):
        ka, kb = self.kind(a), self.kind(b)
        if ka == "bool" and kb == "bool":
            if not isinstance(a, fx.Node):
                a, b = b, a
            if not isinstance(b, fx.Node):
                return a if b else False
            return self.prim("sym_ite", a, b, False)
        if ka == "int" and kb == "int":
            if isinstance(a, fx.Node) and isinstance(b, fx.Node):
                raise _Decline("bitwise and of two symbolic ints: one operand must be a constant")
            if not isinstance(a, fx.Node):
                a, b = b, a
            return self._bits_and(a, b)
        raise _Decline(f"bitwise and of {ka} and {kb}")

    def or_(self, a, b):
        ka, kb = self.kind(a), self.kind(b)
        if ka == "bool" and kb == "bool":
            if not isinstance(a, fx.Node):
                a, b = b, a
            if not isinstance(b, fx.Node):
                return True if b else a
            return self.prim("sym_ite", a, True, b)
        if ka == "int" and kb == "int":
            if isinstance(a, fx.Node) and isinstance(b, fx.Node):
                raise _Decline("bitwise or of two symbolic ints: one operand must be a constant")
            if not isinstance(a, fx.Node):
                a, b = b, a
            return self.prim("sub", self.prim("add", a, b), self._bits_and(a, b))  # a|c = a + c - (a&c)
        raise _Decline(f"bitwise or of {ka} and {kb}")

    def _shift_amount(self, k):
        if isinstance(k, fx.Node) or not isinstance(k, int) or k < 0:
            raise _Decline("the shift amount must be a constant int >= 0")
        return 1 << k

    def lshift(self, a, k):
        return self.prim("mul", a, self._shift_amount(k))

    def rshift(self, a, k):
        return self.prim("floordiv", a, self._shift_amount(k))

    def sym_int(self, x):
        return self.trunc(x)

    def sym_float(self, x):
        return x if self.kind(x) == "float" and not isinstance(x, fx.Node) else self.prim("sym_float", x)

    def sym_sum(self, xs):
        total = 0
        for x in xs:
            total = x if isinstance(total, int) and total == 0 else self.prim("add", total, x)
        return total


def _p(name):
    return lambda b, *args: b.prim(name, *args)


# Python builtin -> lowering(builder, *args). The data of this pass: read it like the table above.
LOWERINGS: dict[Any, Callable] = {
    operator.add: _p("add"),
    operator.sub: _p("sub"),
    operator.mul: _p("mul"),
    operator.neg: _p("neg"),
    operator.truediv: _p("truediv"),
    operator.floordiv: _Builder.floordiv,
    operator.mod: _Builder.mod,
    operator.eq: _p("eq"),
    operator.gt: _p("gt"),
    operator.lt: _p("lt"),
    operator.ge: _p("ge"),
    operator.le: _p("le"),
    operator.ne: _Builder.ne,
    operator.abs: _Builder.abs,
    builtins.abs: _Builder.abs,
    operator.pow: _Builder.pow,
    builtins.pow: _Builder.pow,
    operator.and_: _Builder.and_,
    operator.or_: _Builder.or_,
    operator.lshift: _Builder.lshift,
    operator.rshift: _Builder.rshift,
    math.floor: _Builder.floor,
    math.ceil: _Builder.ceil,
    math.trunc: _Builder.trunc,
    builtins.round: _Builder.round,
    torch.sym_float: _Builder.sym_float,
    torch.sym_int: _Builder.sym_int,
    torch.sym_max: _p("sym_max"),
    torch.sym_min: _p("sym_min"),
    torch.sym_not: _p("sym_not"),
    operator.not_: _p("sym_not"),
    torch.sym_ite: _p("sym_ite"),
    torch.sym_sum: _Builder.sym_sum,
}
# Already-emitted prims are lowered again through their Python meaning (idempotence, and an
# executorch `mod.Scalar` / `round.Scalar` left by another pass gets the exact composition).
_PRIM_MEANING = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "neg": operator.neg,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "eq": operator.eq, "gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le,
    "ceil": math.ceil, "trunc": math.trunc, "round": builtins.round, "sym_float": torch.sym_float,
    "sym_int": torch.sym_int, "sym_max": torch.sym_max, "sym_min": torch.sym_min,
    "sym_not": torch.sym_not, "sym_ite": torch.sym_ite,
}
# Prims that must not stay in an edge graph as they are: mod/round differ from Python on the
# runtime, and the bool-returning ones specialise the program when replayed (see prims.py).
_PRIM_REEMIT = {"mod", "eq", "gt", "lt", "ge", "le", "sym_not"}
# Python builtins that are already final: executorch maps them 1:1 onto exact runtime prims
# after its replay of the graph.
_FINAL = set(BOOL_RESULT_EDGE_FORM.values())


def _is_symbolic_scalar_op(node: fx.Node) -> bool:
    """A call of a plain Python callable (not an op overload) whose result is a scalar."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if isinstance(node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator, EdgeOpOverload)):
        return False
    return isinstance(node.meta.get("val"), _SYM_TYPES + (int, float, bool))


def _lowering_for(node: fx.Node) -> Optional[Callable]:
    if node.op != "call_function":
        return None
    t = node.target
    if t in _FINAL:
        return None
    if t in _PRIM_TARGETS:
        name = _PRIM_NAME[t]
        if name in _PRIM_REEMIT:
            return LOWERINGS[_PRIM_MEANING[name]]
        return None
    try:
        return LOWERINGS.get(t)
    except TypeError:  # unhashable target
        return None


def _todo(gm: fx.GraphModule, path: str) -> list[fx.Node]:
    """The nodes of `gm`'s graph to lower; raises `SymIntLoweringError` at a symbolic builtin
    that has no lowering."""
    todo = []
    for n in gm.graph.nodes:
        if _lowering_for(n) is not None:
            todo.append(n)
        elif _is_symbolic_scalar_op(n) and n.target not in _PRIM_TARGETS and n.target not in _FINAL:
            raise SymIntLoweringError(
                f"node {n.name!r} ({_target_name(n.target)}) in graph {path or '<top>'}: "
                f"{_target_name(n.target)} on symbolic values has no executorch_prim lowering")
    return todo


def _is_edge(gm: fx.GraphModule) -> bool:
    return any(isinstance(n.target, EdgeOpOverload) for n in gm.graph.nodes if n.op == "call_function")


class SymIntToPrimsPass(ExportPass):
    """Rewrites Python SymInt/SymFloat/SymBool builtins into exact `executorch_prim` compositions
    (table in this module's docstring), in the top graph and every control-flow body.

    `lowered` maps graph path ("" for the top graph) to the number of builtin calls rewritten.
    """

    def __init__(self):
        super().__init__()
        install()  # prims retrace symbolically (backend_ops/prims.py)
        self.lowered: dict[str, int] = {}

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.lowered = {}
        # graphs in the order the copy visits them (top first, then each body, depth first), so the
        # first graph with a builtin that has no lowering is the one named
        if not any([_todo(m, path) for path, m in graph_modules(graph_module)]):
            return unchanged(graph_module)
        edge = _is_edge(graph_module)
        # Always a new module (graph_copy): a module shared with the caller breaks when either is lowered.
        return PassResult(copy_graph_module(graph_module, lambda gm, path: self._lowered_graph(gm, path, edge)), True)

    def _lowered_graph(self, gm: fx.GraphModule, path: str, edge: bool) -> fx.Graph:
        todo = _todo(gm, path)
        if not todo:
            return copy_graph(gm.graph)
        graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
        graph._codegen = copy.deepcopy(gm.graph._codegen)
        env: dict[fx.Node, Any] = {}
        builder = _Builder(graph, edge)
        for n in gm.graph.nodes:
            lowering = _lowering_for(n)
            if lowering is None:
                env[n] = graph.node_copy(n, lambda x: env[x])
                continue
            args = fx.map_arg(n.args, lambda x: env[x])
            kwargs = fx.map_arg(n.kwargs, lambda x: env[x])
            try:
                out = lowering(builder, *args, **kwargs)
            except _Decline as e:
                raise SymIntLoweringError(
                    f"node {n.name!r} ({_target_name(n.target)}{tuple(_arg_repr(a) for a in n.args)}) in graph "
                    f"{path or '<top>'}: {e}") from None
            if not isinstance(out, fx.Node):
                out = builder.materialize(out, _first_node(args) if _has_node(args) else None)
            if isinstance(out, fx.Node):
                # The composition computes exactly the node's value: keep its meta (val, trace).
                out.meta = {**n.meta, "etfuse": {"lowered": _target_name(n.target)}}
            env[n] = out
        self.lowered[path] = len(todo)
        return graph


def _has_node(args) -> bool:
    found = []
    fx.node.map_arg(args, lambda a: found.append(a))
    return bool(found)


def _first_node(args) -> fx.Node:
    found = []
    fx.node.map_arg(args, lambda a: found.append(a))
    return found[0]


def _target_name(t) -> str:
    mod = getattr(t, "__module__", None)
    name = getattr(t, "__name__", str(t))
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod == "math":
        return f"math.{name}"
    if mod == "builtins":
        return name
    if mod and mod.startswith("torch"):
        return f"torch.{name}"
    return str(t)


def _arg_repr(a):
    return a.name if isinstance(a, fx.Node) else a
