"""Reusable constraint pieces. Each returns why a match is declined, or None to accept.

They read the bound values' fake tensors (`meta["val"]`), so they cost nothing at run time and a
mismatch means "not fused", never a kernel that crashes later.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from .rule import Match


def all_of(*checks):
    """Combine constraints; the first reason wins."""

    def check(m: Match) -> Optional[str]:
        for c in checks:
            reason = c(m)
            if reason:
                return reason
        return None

    return check


def tensors(names: Iterable[str], dtypes=(torch.float32,), optional: Iterable[str] = ()):
    """Each named binding is a tensor of one of `dtypes` (bindings in `optional` may be None)."""
    names, optional = tuple(names), set(optional)

    def check(m: Match) -> Optional[str]:
        for name in names:
            if name not in m.bindings or (name in optional and m.bindings[name] is None):
                continue
            v = m.value(name)
            if not isinstance(v, torch.Tensor):
                return f"{name} is {type(v).__name__}, not a tensor"
            if v.dtype not in dtypes:
                return f"{name} has dtype {v.dtype}; the kernel takes {', '.join(str(d) for d in dtypes)}"
            if v.device.type != "cpu":
                return f"{name} is on {v.device}; the kernel runs on cpu"
        return None

    return check


def ranks(**wanted: int):
    """Named tensor bindings have exactly these ranks (None bindings are skipped)."""

    def check(m: Match) -> Optional[str]:
        for name, rank in wanted.items():
            v = m.value(name) if name in m.bindings else None
            if v is not None and v.dim() != rank:
                return f"{name} has rank {v.dim()}; the kernel takes rank {rank}"
        return None

    return check


def output_dtype(*dtypes):
    def check(m: Match) -> Optional[str]:
        v = m.anchor_value
        if not isinstance(v, torch.Tensor) or v.dtype not in dtypes:
            return f"the fused result would have dtype {getattr(v, 'dtype', type(v).__name__)}"
        return None

    return check


def int_scalars(names: Iterable[str], what: str = "symbolic conv parameters are not fused"):
    """Each named binding is a constant Python int (not a SymInt node, not a bool)."""
    names = tuple(names)

    def check(m: Match) -> Optional[str]:
        for name in names:
            v = m.bindings[name]
            if isinstance(v, torch.fx.Node) or isinstance(v, bool) or not isinstance(v, int):
                return f"{name} is {v!r}, not a constant int ({what})"
        return None

    return check


_DEQUANTIZE_AFFINE = "torchao::dequantize_affine"


def not_dequantized(name: str = "weight"):
    """`name` is not the output of torchao's `dequantize_affine`: a float op reading it would leave
    the dequantization to the portable runtime, which has no kernel for it. The weight-only rules
    (patterns/weight_only_rules.py) take those linears."""
    def check(m: Match) -> Optional[str]:
        node = m.bindings.get(name)
        target = getattr(getattr(node, "target", None), "_op", getattr(node, "target", None))
        if isinstance(target, torch._ops.OpOverload) and target.name() == _DEQUANTIZE_AFFINE:
            return f"{name} is dequantized by {_DEQUANTIZE_AFFINE}: a weight-only rule's, not a float op's"
        return None
    return check


# --- shapes that may be symbolic (a dynamic Dim) ---------------------------------------------

def known_equal(a, b) -> bool:
    """Whether two sizes are equal for every value their symbols may take (a symbolic size equals
    another only when provably so; nothing is guarded)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))


def broadcasts(shape, to) -> bool:
    """`shape` broadcasts to `to` (each size 1 or `to`'s, provably; `to` may have more dims)."""
    return len(shape) <= len(to) and all(known_equal(d, 1) or known_equal(d, w)
                                         for d, w in zip(reversed(tuple(shape)), reversed(tuple(to))))


def same_shapes(got, want) -> bool:
    """The shapes `got` are the shapes `want`, in any order (each matched once)."""
    remaining = [tuple(w) for w in want]
    for g in got:
        i = next((i for i, w in enumerate(remaining) if same_shape(g, w)), None)
        if i is None:
            return False
        del remaining[i]
    return not remaining
