"""The `executorch_prim` ops: SymInt / SymFloat / SymBool arithmetic the ExecuTorch runtime runs.

executorch defines these ops on import (`exir/passes/executorch_prim_ops_registry.py`) and the
runtime has a kernel for each (`executorch_prim::<name>.Scalar`). etfuse reuses them: the schema
is the same, so nothing is redefined, and `SymIntToPrimsPass` only emits ops from this table.

Each op stands for a Python builtin (its `pattern`). executorch binds some of them to patterns
that specialise a program when it is retraced (`t if b else f`, `not a`, `max(a, b)`,
`int(a) % int(b)`, `float(a)` evaluate a SymBool/SymInt to a Python value, which adds a guard
and bakes the example size into the graph). `ensure_registered()` rebinds those ops'
CompositeImplicitAutograd kernels to the symbolic builtins (`torch.sym_ite`, `torch.sym_not`,
...), so a program holding prims retraces to the same symbolic arithmetic. That replaces
executorch's kernels, so importing this module does not do it: `etfuse.backend_ops.install()` does.

`RUNTIME_EXACT` records, per op, the operand kinds for which the runtime kernel gives exactly
what Python gives (measured in tests/test_symint_prims.py). Everything else is composed from
these by the pass (e.g. `a % b` is `a - (a // b) * b`: the runtime's `mod.Scalar` is C's `%`).
"""

from __future__ import annotations

__all__ = ["PrimOp", "PRIMS", "BOOL_RESULT_EDGE_FORM", "RUNTIME_EXACT", "ensure_registered", "sym_ite"]

import dataclasses
import math
import operator
import warnings
from typing import Callable

import torch
from torch.library import Library

from executorch.exir.dialects._ops import bind_pattern_to_op, ops as exir_ops
import executorch.exir.passes.executorch_prim_ops_registry  # noqa: F401  (defines the namespace)

NAMESPACE = "executorch_prim"


@dataclasses.dataclass(frozen=True)
class PrimOp:
    name: str  # `add` (overload is always `Scalar`)
    schema: str
    pattern: Callable  # the Python builtin this op computes, symbolic-safe
    rebind: bool = False  # executorch's own pattern guards on retrace: replace it

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}.Scalar"

    @property
    def backend(self):
        """The op as it appears in an edge/backend-dialect graph."""
        return getattr(exir_ops.backend.executorch_prim, self.name).Scalar

    @property
    def aten(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.executorch_prim, self.name).Scalar


def _band(x, y):
    if x is False or y is False:
        return False
    if x is True:
        return y
    return x if y is True else x & y


def _bor(x, y):
    if x is True or y is True:
        return True
    if x is False:
        return y
    return x if y is False else x | y


def sym_ite(b, t, f):
    """`t if b else f` without evaluating a SymBool; branches may mix literals and symbols."""
    if isinstance(b, bool):
        return t if b else f
    if type(t) is type(f):
        return torch.sym_ite(b, t, f)
    if isinstance(t, (bool, torch.SymBool)) and isinstance(f, (bool, torch.SymBool)):
        return _bor(_band(b, t), _band(torch.sym_not(b), f))
    return f + (t - f) * torch.sym_ite(b, 1, 0)


def _sym_not(a):
    return torch.sym_not(a)


def _sym_max(a, b):
    return torch.sym_max(a, b)


def _sym_min(a, b):
    return torch.sym_min(a, b)


def _sym_float(a):
    return torch.sym_float(a)


def _sym_int(a):
    return torch.sym_int(a)


def _mod(a, b):
    return a % b


_S2 = "(Scalar a, Scalar b) -> Scalar"
_B2 = "(Scalar a, Scalar b) -> bool"
_S1 = "(Scalar a) -> Scalar"

PRIMS: dict[str, PrimOp] = {p.name: p for p in [
    PrimOp("add", "add.Scalar" + _S2, operator.add),
    PrimOp("sub", "sub.Scalar" + _S2, operator.sub),
    PrimOp("mul", "mul.Scalar" + _S2, operator.mul),
    PrimOp("floordiv", "floordiv.Scalar" + _S2, operator.floordiv),
    PrimOp("truediv", "truediv.Scalar" + _S2, operator.truediv),
    PrimOp("mod", "mod.Scalar(SymInt a, SymInt b) -> SymInt", _mod, rebind=True),
    PrimOp("neg", "neg.Scalar" + _S1, operator.neg),
    PrimOp("eq", "eq.Scalar" + _B2, operator.eq),
    PrimOp("gt", "gt.Scalar" + _B2, operator.gt),
    PrimOp("lt", "lt.Scalar" + _B2, operator.lt),
    PrimOp("ge", "ge.Scalar" + _B2, operator.ge),
    PrimOp("le", "le.Scalar" + _B2, operator.le),
    PrimOp("ceil", "ceil.Scalar" + _S1, math.ceil),
    PrimOp("trunc", "trunc.Scalar" + _S1, math.trunc),
    PrimOp("round", "round.Scalar" + _S1, round),  # half to even, like Python
    PrimOp("sym_float", "sym_float.Scalar" + _S1, _sym_float, rebind=True),
    PrimOp("sym_int", "sym_int.Scalar" + _S1, _sym_int, rebind=True),
    PrimOp("sym_max", "sym_max.Scalar" + _S2, _sym_max, rebind=True),
    PrimOp("sym_min", "sym_min.Scalar" + _S2, _sym_min, rebind=True),
    PrimOp("sym_not", "sym_not.Scalar(Scalar a) -> bool", _sym_not, rebind=True),
    PrimOp("sym_ite", "sym_ite.Scalar(Scalar b, Scalar t, Scalar f) -> Scalar", sym_ite, rebind=True),
]}

# The prims whose schema returns `bool` turn a SymBool result into a Python bool when they are
# dispatched, which adds a guard and specialises the program to the example size. executorch
# replays every node of an edge graph through the dispatcher (`SpecPropPass`, at the start of
# `to_executorch`), so an edge graph must not hold these ops: it holds the Python comparison,
# which executorch's `EdgeToBackendOpsPass` turns into exactly this prim after that replay
# (measured: `n > 7` held as `executorch_prim.gt.Scalar` caps a Dim(max=40) input at 7).
# `sym_not(x)` is emitted as `sym_ite(x, False, True)`, which returns a Scalar.
BOOL_RESULT_EDGE_FORM = {
    "eq": operator.eq, "gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le,
}

# Operand kinds ("int", "float", "bool") for which the runtime kernel equals Python exactly.
# Measured (tests/test_symint_prims.py): the runtime's mod.Scalar is C's `%` (the sign of the
# dividend: -5 % 3 == -2, Python says 1), so it is never emitted; floordiv.Scalar on ints floors
# like Python (-5 // 3 == -2) and round.Scalar rounds half to even like Python.
RUNTIME_EXACT = {
    "floordiv": {"int"},
    "round": {"float"},
    "mod": set(),
}

_LIB: Library | None = None


def ensure_registered() -> dict[str, PrimOp]:
    """Check every prim exists with the expected schema, define missing ones, and rebind the
    patterns that would specialise a retraced program. Idempotent."""
    global _LIB
    if _LIB is not None:
        return PRIMS
    lib = Library(NAMESPACE, "FRAGMENT")
    for p in PRIMS.values():
        existing = [s for s in torch._C._jit_get_schemas_for_operator(f"{NAMESPACE}::{p.name}")
                    if s.overload_name == "Scalar"]
        wanted = torch._C.parse_schema(f"{NAMESPACE}::{p.schema}")
        if not existing:
            bind_pattern_to_op(lib, p.schema)(p.pattern)
        elif str(existing[0]) != str(wanted):
            raise RuntimeError(
                f"{p.qualname} is registered with schema {existing[0]}, etfuse expects {wanted}")
        elif p.rebind:
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": intended
                warnings.simplefilter("ignore", UserWarning)
                lib.impl(f"{p.name}.Scalar", p.pattern, "CompositeImplicitAutograd")
    _LIB = lib
    return PRIMS
