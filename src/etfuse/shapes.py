"""The `etfuse fuse --shape` values: parsed, checked against the exported program's inputs (rank,
static sizes, the ranges of its `Dim`s, memory), and turned into example inputs, each refusal one
line that names the input, the dim and what the program takes.
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

import torch

from .errors import CliError

_SHAPE_RE = re.compile(r"^\s*-?\d+(\s*[,x]\s*-?\d+)*\s*$")


def parse_shape(text: str) -> tuple[int, ...]:
    if not _SHAPE_RE.match(text or ""):
        raise CliError(f"--shape {text!r}: expected sizes like 1,3,224,224 (positive integers)")
    shape = tuple(int(d) for d in re.split(r"[,x]", text.replace(" ", "")))
    bad = [d for d in shape if d <= 0]
    if bad:
        raise CliError(f"--shape {text}: sizes must be positive integers, got {bad[0]}")
    return shape


def fix_negative_shapes(argv: list[str]) -> list[str]:
    """`--shape -4,16` would be read by argparse as an option: keep it as --shape's value."""
    fixed, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--shape" and i + 1 < len(argv) and argv[i + 1].startswith("-") and re.match(r"^-\d", argv[i + 1]):
            fixed.append(f"--shape={argv[i + 1]}")
            i += 2
            continue
        fixed.append(a)
        i += 1
    return fixed


def _user_inputs(ep: torch.export.ExportedProgram) -> list[tuple[str, object]]:
    """(name, example value: FakeTensor / int / ...) of each user input, in order."""
    from torch.export.graph_signature import InputKind

    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    found = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            name = getattr(spec.arg, "name", str(spec.arg))
            found.append((name, nodes[name].meta.get("val") if name in nodes else None))
    return found


def _dim_range(ep, size) -> tuple[Optional[int], Optional[int], bool]:
    """(min, max, dynamic) of one dim of an input; max None when unbounded."""
    if isinstance(size, int):
        return size, size, False
    expr = size.node.expr
    vr = ep.range_constraints.get(expr)
    if vr is None:
        return None, None, True
    return _finite(vr.lower), _finite(vr.upper), True


def _finite(bound) -> Optional[int]:
    try:
        value = float(bound)  # torch's int_oo says is_finite=True; float() says inf
    except (TypeError, ValueError):
        return None
    return int(value) if math.isfinite(value) else None


def _describe(ep, val) -> str:
    dims = []
    for size in val.shape:
        lo, hi, dynamic = _dim_range(ep, size)
        dims.append(str(lo) if not dynamic else f"{lo if lo is not None else 0}..{hi if hi is not None else 'inf'}")
    return f"{str(val.dtype).replace('torch.', '')}, rank {val.dim()}, sizes [{', '.join(dims)}]"


def _memory_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human_size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    return f"{nbytes:.3g} EiB"


def check_shapes(ep, shapes: list[tuple[int, ...]], texts: list[str]) -> list[tuple[str, object]]:
    """Refuse --shape values the program cannot take; returns the user inputs."""
    inputs = _user_inputs(ep)
    if len(shapes) != len(inputs):
        names = ", ".join(name for name, _ in inputs)
        raise CliError(f"{len(shapes)} --shape given, the program takes {len(inputs)} input"
                       f"{'s' * (len(inputs) != 1)} ({names}): give one --shape per input, in order")
    total = 0
    for i, ((name, val), shape, text) in enumerate(zip(inputs, shapes, texts)):
        where = f"--shape {text} for input {i} ({name})"
        if not isinstance(val, torch.Tensor):
            raise CliError(f"{where}: this input is a {type(val).__name__}, not a tensor; save the program "
                           "with example inputs instead of giving --shape")
        if len(shape) != val.dim():
            raise CliError(f"{where}: rank {len(shape)}, the program expects rank {val.dim()} "
                           f"({_describe(ep, val)})")
        for d, (want, got) in enumerate(zip(val.shape, shape)):
            lo, hi, dynamic = _dim_range(ep, want)
            if not dynamic and got != lo:
                raise CliError(f"{where}: dim {d} is static ({lo}) in this program; export it with a "
                               f"torch.export.Dim for dim {d} to fuse other sizes ({_describe(ep, val)})")
            if dynamic and ((lo is not None and got < lo) or (hi is not None and got > hi)):
                raise CliError(f"{where}: dim {d} must be in {lo if lo is not None else 0}..{hi if hi is not None else 'inf'} "
                               f"(the program's Dim range; {_describe(ep, val)})")
        elem = torch.empty((), dtype=val.dtype).element_size()
        total += math.prod(shape) * elem
    available = _memory_available()
    if available is not None and total > available // 2:
        raise CliError(f"--shape: the inputs alone need {human_size(total)}; this machine has {human_size(available)} "
                       "of memory available")
    return inputs


def _random_like(shape, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    return torch.randint(0, 2, shape, dtype=dtype)  # small: safe as indices too


def example_inputs(ep: torch.export.ExportedProgram, shapes: Optional[list[str]]) -> tuple:
    if shapes:
        parsed = [parse_shape(s) for s in shapes]
        inputs = check_shapes(ep, parsed, shapes)
        return tuple(_random_like(shape, val.dtype) for shape, (_, val) in zip(parsed, inputs))
    saved = getattr(ep, "example_inputs", None)
    if saved is None:
        n = len(_user_inputs(ep))
        raise CliError(f"the program was saved without example inputs: give one --shape per input ({n})")
    args, kwargs = saved
    if kwargs:
        raise CliError("programs with keyword inputs are not supported: give one --shape per positional input")
    return tuple(args)
