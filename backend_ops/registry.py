"""One declaration per backend op; everything else is derived from it.

A `BackendOp` names a namespace, a functional schema and a *pattern*: the ATen composition the op
stands for. `register` derives the rest:

* the functional op, bound to its pattern with executorch's `bind_pattern_to_op`, so the pattern
  is its CompositeImplicitAutograd kernel: `run_decompositions()` gives the pattern back, and the
  pattern *is* its fake kernel (torch refuses `register_fake` on CompositeImplicitAutograd ops);
* the `.out` variant that `to_executorch` emits and the ExecuTorch runtime runs, with a
  reference CompositeExplicitAutograd kernel (pattern, then copy) that compiled CPU kernels
  override, and a fake kernel derived from the pattern.

Registration coexists with other registrations of the same namespace (executorch defines some
`quantized_decomposed` ops itself): an identical existing schema is reused, a conflicting one is
an error naming the op and both schemas.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable, Optional

import torch
from torch.library import Library

from executorch.exir.dialects._ops import bind_pattern_to_op, ops as exir_ops
from etfuse.errors import EtfuseError


class BackendOpError(EtfuseError, RuntimeError):
    """A backend op cannot be declared or registered as asked."""


# Namespaces whose `.out` kernels executorch's own libraries register (its stock quantized
# kernels): etfuse defines no `.out` variant there; a program calls the etfuse twin of such an op
# (runtime_names.py), so etfuse's kernels and executorch's live in one process and one app.
SHARED_NAMESPACES = ("quantized_decomposed",)


@dataclasses.dataclass(frozen=True)
class BackendOp:
    namespace: str
    schema: str
    pattern: Callable
    doc: str = ""
    # Kernel metadata: etfuse.kernels derives its op lists, build sources and Triton
    # registrations from it. `kernel`: the C++ file kernels/csrc/ops/<kernel>.cpp that holds the
    # `.out` kernel (None: the reference kernel only; for an op of a namespace executorch's own
    # kernels share, the file registers the op's etfuse twin, runtime_names.py). `triton`: the
    # launcher in kernels/triton/launch.py that serves CUDA tensors, or None.
    kernel: Optional[str] = None
    triton: Optional[str] = None
    # `inplace`: the op also gets an in-place form, `<name>_(Tensor(a!) self, ...) -> Tensor(a!)`
    # (the first argument must be `Tensor self`), which the runtime kernel file registers too;
    # `to_executorch` of a fused program switches to it where executorch's reinplace checks
    # allow (passes/fused_program.py).
    inplace: bool = False

    @property
    def name(self) -> str:
        """`add_relu` or `add.scalar`: the op name with its overload, no namespace."""
        return self.schema.split("(", 1)[0].strip()

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def out_name(self) -> str:
        base, _, overload = self.name.partition(".")
        return f"{base}.{overload + '_out' if overload else 'out'}"

    @property
    def out_schema(self) -> str:
        """The functional schema with a trailing `Tensor(a!) out`, the ExecuTorch convention."""
        args, _, ret = self.schema.split("(", 1)[1].rpartition(")")
        returns = ret.replace("->", "").split()  # "Tensor", or a named one: "Tensor qc" (seed schemas)
        if not returns or returns[0] != "Tensor" or len(returns) > 2:
            raise BackendOpError(f"{self.qualname}: only single-Tensor returns get an out variant, got {ret.strip()!r}")
        sep = ", " if "*" in args else ", *, "
        return f"{self.out_name}({args}{sep}Tensor(a!) out) -> Tensor(a!)"

    @property
    def inplace_name(self) -> str:
        base, _, overload = self.name.partition(".")
        return f"{base}_" + (f".{overload}" if overload else "")

    @property
    def inplace_schema(self) -> str:
        """The functional schema with `self` written in place and returned."""
        args, _, ret = self.schema.split("(", 1)[1].rpartition(")")
        if not args.startswith("Tensor self") or ret.replace("->", "").strip() != "Tensor":
            raise BackendOpError(f"{self.qualname}: an in-place form needs `Tensor self` first and one Tensor "
                                 f"returned, got {self.schema!r}")
        return f"{self.inplace_name}(Tensor(a!) self{args[len('Tensor self'):]}) -> Tensor(a!)"

    @functools.cached_property
    def arg_names(self) -> list[str]:
        return [a.name for a in torch._C.parse_schema(f"{self.namespace}::{self.schema}").arguments]

    # Handles on the registered op, in the three dialects a graph may hold.
    def _handle(self, name: str) -> torch._ops.OpOverload:
        base, _, overload = name.partition(".")
        return getattr(getattr(getattr(torch.ops, self.namespace), base), overload or "default")

    @property
    def aten(self) -> torch._ops.OpOverload:
        return self._handle(self.name)

    @property
    def aten_out(self) -> torch._ops.OpOverload:
        return self._handle(self.out_name)

    @property
    def aten_inplace(self) -> torch._ops.OpOverload:
        return self._handle(self.inplace_name)

    @property
    def backend(self):
        """The op as it appears in a fused edge-dialect graph (executorch's BackendOpOverload)."""
        base, _, overload = self.name.partition(".")
        return getattr(getattr(getattr(exir_ops.backend, self.namespace), base), overload or "default")


_LIBRARIES: dict[str, Library] = {}
_REGISTERED: dict[str, BackendOp] = {}


def library(namespace: str) -> Library:
    """etfuse's `Library` fragment for `namespace` (kept alive: a collected Library takes its registrations)."""
    # FRAGMENT, not DEF: torch.ao and executorch already own some namespaces we add ops to.
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


def _existing_schema(namespace: str, name: str) -> Optional[torch._C.FunctionSchema]:
    base, _, overload = name.partition(".")
    for schema in torch._C._jit_get_schemas_for_operator(f"{namespace}::{base}"):
        if schema.overload_name == overload:
            return schema
    return None


def _define(lib: Library, op: BackendOp, schema: str) -> bool:
    """Define `schema` unless an identical one exists. Returns True when we defined it."""
    wanted = torch._C.parse_schema(f"{op.namespace}::{schema}")
    existing = _existing_schema(op.namespace, wanted.name.split("::")[1] + (f".{wanted.overload_name}" if wanted.overload_name else ""))
    if existing is None:
        lib.define(schema)
        return True
    if str(existing) != str(wanted):
        raise BackendOpError(
            f"backend op {existing.name}{'.' + existing.overload_name if existing.overload_name else ''} "
            f"is already registered with a different schema:\n  existing: {existing}\n  etfuse:   {wanted}"
        )
    return False


def has_kernel(qualname: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)


def _out_reference_kernel(op: BackendOp):
    def kernel(*args, out, **kwargs):
        result = op.pattern(*args, **kwargs)
        out.resize_(result.shape)
        return out.copy_(result)

    return kernel


def out_fake_kernel(op: BackendOp):
    def fake(*args, out, **kwargs):
        result = op.pattern(*args, **kwargs)
        if result.dtype != out.dtype:
            raise BackendOpError(f"{op.qualname}.out: out has dtype {out.dtype}, the op produces {result.dtype}")
        if tuple(out.shape) != tuple(result.shape):
            raise BackendOpError(f"{op.qualname}.out: out has shape {tuple(out.shape)}, the op produces {tuple(result.shape)}")
        return out

    return fake


def register(op: BackendOp) -> BackendOp:
    """Register `op` (functional + out variant) with torch and executorch. Idempotent."""
    if op.qualname in _REGISTERED:
        if _REGISTERED[op.qualname] is not op:
            raise BackendOpError(f"backend op {op.qualname} is declared twice in etfuse")
        return op
    params = list(inspect.signature(op.pattern).parameters)
    if params != op.arg_names:
        raise BackendOpError(
            f"backend op {op.qualname}: pattern parameters {params} must be the schema's arguments {op.arg_names}"
        )
    lib = library(op.namespace)
    _define(lib, op, op.schema)
    # bind_pattern_to_op installs the pattern as the CompositeImplicitAutograd kernel unless the
    # op already has one (or an explicit/Meta kernel); it always makes the backend-dialect handle.
    bind_pattern_to_op(lib, op.name)(op.pattern)
    if op.namespace in SHARED_NAMESPACES:
        _REGISTERED[op.qualname] = op
        return op

    _define(lib, op, op.out_schema)
    out_qualname = f"{op.namespace}::{op.out_name}"
    if _lacks_reference(out_qualname):
        lib.impl(op.out_name, _out_reference_kernel(op), "CompositeExplicitAutograd")
    if _lacks_fake(out_qualname):
        torch.library.register_fake(out_qualname, out_fake_kernel(op), lib=lib)
    if op.inplace:
        _register_inplace(lib, op)
    _REGISTERED[op.qualname] = op
    return op


def _register_inplace(lib: Library, op: BackendOp) -> None:
    """`<name>_`: a reference kernel (the pattern, copied into self) that the runtime library's
    kernel replaces on the ExecuTorch runtime, and a fake kernel (self, as it is)."""
    _define(lib, op, op.inplace_schema)
    qualname = f"{op.namespace}::{op.inplace_name}"
    if _lacks_reference(qualname):
        lib.impl(op.inplace_name, lambda self, *args, **kwargs: self.copy_(op.pattern(self, *args, **kwargs)),
                 "CompositeExplicitAutograd")
    if _lacks_fake(qualname):
        torch.library.register_fake(qualname, lambda self, *args, **kwargs: self, lib=lib)


def _lacks_reference(qualname: str) -> bool:
    """No kernel that a reference kernel would shadow (compiled CPU kernels register first)."""
    return not has_kernel(qualname, "CompositeExplicitAutograd") and not has_kernel(qualname, "CPU")


def _lacks_fake(qualname: str) -> bool:
    return not has_kernel(qualname, "Meta") and torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is None


def registered_ops() -> list[BackendOp]:
    return list(_REGISTERED.values())
