"""Run programs on the ExecuTorch runtime in this process, with etfuse's kernels loaded.

`load_method` returns a `Method` whose `execute` checks every input against what the program
was exported with (read from the .pte itself) before the runtime sees it:

* a tensor whose memory layout (dim order / strides) differs from the program's input, e.g. a
  channels-last tensor for a program exported with contiguous inputs, is copied into the
  expected layout (the stock runtime accepts it and silently reads it in the wrong order);
* a wrong dtype, rank, static size, a size over a dynamic dim's bound, or a wrong number of
  inputs raises `InputMismatchError` naming the input and what the program expects (the stock
  runtime answers with an error code, or reads the bytes wrongly).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence

import torch

__all__ = ["InputMismatchError", "InputSpec", "Method", "input_specs", "load_method", "run"]


class InputMismatchError(ValueError):
    """An input the program cannot take as given (wrong count, dtype, rank or size)."""


# executorch's ScalarType (exir/_serialize/scalar_type.fbs) -> torch dtype
_SCALAR_TYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16, 27: torch.uint16,
    28: torch.uint32, 29: torch.uint64,
}
# KernelTypes union tags (program.fbs)
_KINDS = {0: "none", 1: "none", 2: "int", 3: "bool", 4: "float", 5: "tensor", 6: "string",
          7: "int list", 8: "float list", 9: "bool list", 10: "tensor list", 11: "optional tensor list"}
_STATIC, _UNBOUND = 0, 2  # TensorShapeDynamism


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of a method, as the .pte records it. For tensors, `sizes` are the sizes the
    program was planned for: exact when `dynamic` is False, upper bounds otherwise."""

    index: int
    kind: str
    dtype: Optional[torch.dtype] = None
    sizes: tuple[int, ...] = ()
    dim_order: tuple[int, ...] = ()
    dynamic: bool = False
    bounded: bool = True  # False: DYNAMIC_UNBOUND, `sizes` bound nothing

    def describe(self) -> str:
        if self.kind != "tensor":
            return self.kind
        dims = ", ".join(str(s) for s in self.sizes)
        layout = "" if self.dim_order == tuple(range(len(self.sizes))) else f", dim order {list(self.dim_order)}"
        bound = " (upper bounds)" if self.dynamic else ""
        return f"{str(self.dtype).replace('torch.', '')} tensor of rank {len(self.sizes)}, sizes [{dims}]{bound}{layout}"


def _field(tab, index: int) -> int:
    return tab.Offset(4 + 2 * index)


def _child(tab, index: int):
    import flatbuffers

    o = _field(tab, index)
    return None if o == 0 else flatbuffers.table.Table(tab.Bytes, tab.Indirect(o + tab.Pos))


def _vector(tab, index: int, width: int, fmt) -> list:
    o = _field(tab, index)
    if o == 0:
        return []
    start, n = tab.Vector(o), tab.VectorLen(o)
    return [tab.Get(fmt, start + i * width) for i in range(n)]


def _table_vector_item(tab, index: int, j: int):
    import flatbuffers

    o = _field(tab, index)
    if o == 0 or j >= tab.VectorLen(o):
        return None
    x = tab.Vector(o) + j * 4
    return flatbuffers.table.Table(tab.Bytes, tab.Indirect(x))


def input_specs(program: bytes, method: str = "forward") -> list[InputSpec]:
    """The inputs of `method` in a serialized .pte (dtype, sizes, dim order, dynamism), read
    straight from its flatbuffer (nothing is copied or unpacked but these few fields)."""
    import flatbuffers
    from flatbuffers import number_types as N

    buf = bytes(program) if not isinstance(program, bytes) else program
    root = flatbuffers.table.Table(buf, flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0))
    plans_off = _field(root, 1)
    for j in range(root.VectorLen(plans_off) if plans_off else 0):
        plan = _table_vector_item(root, 1, j)
        name_off = _field(plan, 0)
        if name_off == 0 or plan.String(name_off + plan.Pos).decode() != method:
            continue
        specs = []
        for i, v in enumerate(_vector(plan, 3, 4, N.Int32Flags)):
            evalue = _table_vector_item(plan, 2, v)
            tag_off = _field(evalue, 0)
            tag = evalue.Get(N.Uint8Flags, tag_off + evalue.Pos) if tag_off else 0
            kind = _KINDS.get(tag, "other")
            if kind != "tensor":
                specs.append(InputSpec(i, kind))
                continue
            o = _field(evalue, 1)
            tensor = flatbuffers.table.Table(buf, evalue.Indirect(o + evalue.Pos))
            st_off = _field(tensor, 0)
            scalar = tensor.Get(N.Int8Flags, st_off + tensor.Pos) if st_off else 0
            sizes = tuple(_vector(tensor, 2, 4, N.Int32Flags))
            order = tuple(_vector(tensor, 3, 1, N.Uint8Flags)) or tuple(range(len(sizes)))
            dyn_off = _field(tensor, 8)
            dynamism = tensor.Get(N.Int8Flags, dyn_off + tensor.Pos) if dyn_off else _STATIC
            specs.append(InputSpec(i, "tensor", _SCALAR_TYPES.get(scalar), sizes, order, dynamism != _STATIC,
                                   dynamism != _UNBOUND))
        return specs
    raise KeyError(f"the program has no method {method!r}")


def _strides_for(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return tuple(strides)


def _name(spec: InputSpec, names: Optional[Sequence[str]]) -> str:
    if names and spec.index < len(names):
        return f"input {spec.index} ({names[spec.index]})"
    return f"input {spec.index}"


def check_inputs(specs: Sequence[InputSpec], inputs: Sequence[Any], method: str = "forward",
                 names: Optional[Sequence[str]] = None) -> tuple:
    """`inputs` as the program can read them: tensors in another memory layout are copied into
    the program's; anything else it cannot take raises `InputMismatchError`."""
    inputs = tuple(inputs)
    if len(inputs) != len(specs):
        raise InputMismatchError(f"{method} takes {len(specs)} input{'s' * (len(specs) != 1)}, got {len(inputs)}")
    out = []
    for spec, x in zip(specs, inputs):
        if spec.kind != "tensor":
            out.append(x)
            continue
        where = _name(spec, names)
        if not isinstance(x, torch.Tensor):
            raise InputMismatchError(f"{where}: expected a {spec.describe()}, got a {type(x).__name__}")
        if spec.dtype is not None and x.dtype != spec.dtype:
            raise InputMismatchError(f"{where}: expected dtype {str(spec.dtype).replace('torch.', '')}, "
                                     f"got {str(x.dtype).replace('torch.', '')} (the program takes a {spec.describe()})")
        if x.dim() != len(spec.sizes):
            raise InputMismatchError(f"{where}: expected rank {len(spec.sizes)}, got shape {list(x.shape)} "
                                     f"(the program takes a {spec.describe()})")
        for d, (got, want) in enumerate(zip(x.shape, spec.sizes)):
            if (got != want and not spec.dynamic) or (got > want and spec.bounded):
                what = f"at most {want}" if spec.dynamic else f"{want}"
                raise InputMismatchError(f"{where}: dim {d} is {got}, the program expects {what} "
                                         f"(it takes a {spec.describe()})")
        if x.layout != torch.strided:
            raise InputMismatchError(f"{where}: expected a dense (strided) tensor, got layout {x.layout}")
        if x.stride() != _strides_for(x.shape, spec.dim_order) or x.storage_offset() != 0:
            order = list(spec.dim_order)
            inverse = [order.index(d) for d in range(len(order))]
            x = x.permute(order).contiguous().permute(inverse)
        out.append(x)
    return tuple(out)


class Method:
    """An ExecuTorch runtime method whose `execute` checks and converts its inputs first (see
    the module docstring). Everything else is the runtime's `Method`."""

    def __init__(self, method, specs: Sequence[InputSpec], name: str, keepalive):
        self._method = method
        self.input_specs = list(specs)
        self.name = name
        self.input_names: Optional[list[str]] = None
        # The runtime reads the .pte in place (load_program(bytes) does not copy): the bytes and
        # the Program must live as long as the Method.
        self._etfuse_keepalive = keepalive

    def check_inputs(self, inputs: Sequence[Any]) -> tuple:
        return check_inputs(self.input_specs, inputs, self.name, self.input_names)

    def execute(self, inputs: Sequence[Any]) -> Sequence[Any]:
        return self._method.execute(self.check_inputs(inputs))

    def execute_unchecked(self, inputs: Sequence[Any]) -> Sequence[Any]:
        return self._method.execute(inputs)

    @property
    def metadata(self):
        return self._method.metadata

    def __getattr__(self, name):
        return getattr(self._method, name)


def load_method(program, method: str = "forward") -> Method:
    """An ExecuTorch runtime `Method` for a .pte given as bytes, a path, or an
    `ExecutorchProgramManager`. Loads etfuse's kernels first so fused ops resolve."""
    from executorch.runtime import Runtime

    import etfuse.kernels

    etfuse.kernels.load()
    if hasattr(program, "buffer"):
        program = program.buffer
    if not isinstance(program, (bytes, bytearray)):
        with open(os.fspath(program), "rb") as f:
            program = f.read()
    program = bytes(program)
    loaded = Runtime.get().load_program(program)
    runtime_method = loaded.load_method(method)
    if runtime_method is None:
        raise KeyError(f"the program has no method {method!r}")
    return Method(runtime_method, input_specs(program, method), method, (program, loaded))


def run(program, inputs: Sequence[torch.Tensor], method: str = "forward") -> list:
    """Execute `method` of a .pte once on the ExecuTorch runtime; returns its outputs.
    Inputs are checked against the program first (see `Method`)."""
    return list(load_method(program, method).execute(tuple(inputs)))
