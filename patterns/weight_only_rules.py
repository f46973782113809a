"""Weight-only quantized linears: what torchao's `IntxWeightOnlyConfig` (int8 per channel, int4 in
groups) leaves in the edge dialect, `torchao.dequantize_affine(q, [1, g], scale, zp, int8, qmin,
qmax) -> permute_copy -> mm / addmm` (rank 2) or the same between two view_copy (rank >= 3), as
one `etfuse::linear_qw` that keeps the weight quantized (backend_ops/weight_only_ops.py).

| rule                                   | edge pattern                                                  | replacement                   |
|----------------------------------------|---------------------------------------------------------------|-------------------------------|
| linear_q{8,4}[_no_bias][_silu]         | mm(x, permute(dequantize_affine(q, ...))) or addmm(b, ...)     | linear_qw(x, q', ...)         |
| linear_q{8,4}_nd[_no_bias][_silu]      | view(mm(view(x), permute(dequantize_affine(q, ...)))) or addmm | linear_qw(x, q', ..., "silu") |
|                                        | [-> mul(., sigmoid(.))]                                       |                               |
| linear_q{8,4}[_nd][_no_bias]_residual  | add(either linear above without the SiLU, r)  (commutative)    | linear_qw(x, q', ..., r)      |

{8,4} is the width the quant range declares ((-128, 127) or (-8, 7)). At 8 bits q' is q; at 4 bits
the replacement is a function, `pack_int4(q)` then the op; `etfuse.fuse` / `transform
(default_passes())` fold the packing into a constant and drop zero points that are all 0
(passes/fold_packed_weights.py; the 8-bit rules drop them themselves). Without a rule the program
does not run on the portable runtime at all: it has no `dequantize_affine` kernel.

The residual rules take a transformer's skip connection `r + linear(h)` into the op's residual
epilogue, as linear_residual_rules does for float linears, with its check: r the linear's output
shape exactly.

The fused op dequantizes as `dequantize_affine` does ((q - zp) * scale, float32), so the retraced
program is the original one; the kernel sums in another order (float32 accumulation tolerance).
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from etfuse.backend_ops import LINEAR_QW, PACK_INT4

from .constraints import all_of, output_dtype, tensors
from .embedding_rules import _zero_points_all_zero
from .linear_rank_rules import linear_nd_shapes as _nd_shapes
from .linear_residual_rules import _residual_shape
from .rule import Match, Rule

aten = torch.ops.aten
WIDTHS = {8: (-128, 127), 4: (-8, 7)}
_CHUNK = 32  # pack_int4 packs 32-column chunks


_WEIGHT = ("weight", "group_size", "scale", "zero_point", "quant_min", "quant_max")


def _weight(weight, group_size, scale, zero_point, quant_min, quant_max):
    w = torch.ops.torchao.dequantize_affine.default(weight, [1, group_size], scale, zero_point, torch.int8,
                                                    quant_min, quant_max, torch.float32)
    return aten.permute.default(w, [1, 0])


def _named(fn, names: list[str]):
    """fn(*args) under a signature of these names: the engine binds a pattern's (and a function
    replacement's) inputs by parameter name, and each combination of operands has its own."""
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return fn


def _parameters(lead: tuple, bias: bool, residual: bool) -> list[str]:
    return [*lead, *_WEIGHT, *(["bias"] if bias else []), *(["residual"] if residual else [])]


def _pattern(nd: bool, bias: bool, silu: bool, residual: bool, lead: tuple, activation):
    names = _parameters(lead, bias, residual)

    def pattern(*args):
        a = dict(zip(names, args))
        x = activation(a, nd)
        flat = aten.view.default(x, [15, 32]) if nd else x
        w = _weight(*(a[n] for n in _WEIGHT))
        y = aten.addmm.default(a["bias"], flat, w) if bias else aten.mm.default(flat, w)
        y = aten.view.default(y, [3, 5, 6]) if nd else y
        if residual:
            return aten.add.Tensor(y, a["residual"])
        return aten.mul.Tensor(y, aten.sigmoid.default(y)) if silu else y
    return _named(pattern, names)


def _examples(nd: bool, bias: bool, residual: bool, lead_examples):
    # distinct scalars (export's literals are found by value): group 16 of 32 columns, range (-8, 7)
    def examples():
        x = torch.randn(3, 5, 32) if nd else torch.randn(15, 32)
        args = (*lead_examples(x), torch.zeros(6, 32, dtype=torch.int8), 16, torch.ones(6, 2),
                torch.zeros(6, 2, dtype=torch.int8), -8, 7)
        return (*args, *((torch.randn(6),) if bias else ()),
                *((torch.randn(3, 5, 6) if nd else torch.randn(15, 6),) if residual else ()))
    return examples


def _packed_weight(a: dict, bits: int) -> tuple:
    """linear_qw's weight operand: q itself at 8 bits, `pack_int4(q)` at 4."""
    return (PACK_INT4.aten(a["weight"]) if bits == 4 else a["weight"],)


def _replacement(op, bits: int, bias: bool, silu: bool, residual: bool, lead: tuple, weight_operands):
    """op(input, *weight_operands(bindings, bits), scale, zero_point, bits, bias, act, residual):
    the replacement function of the rules whose weight goes through ops (packing) first."""
    names = _parameters(lead, bias, residual)
    act = "silu" if silu else "none"

    def replacement(*args):
        a = dict(zip(names, args))
        return op.aten(a["input"], *weight_operands(a, bits), a["scale"], a["zero_point"], bits, a.get("bias"), act,
                       a.get("residual"))
    return _named(replacement, names)


def _int8_arguments(bias: bool, silu: bool, residual: bool = False):
    def arguments(m: Match):
        b = m.bindings
        zp = None if b["zero_point"] is None or _zero_points_all_zero(m, "zero_point") else b["zero_point"]
        return (b["input"], b["weight"], b["scale"], zp, 8, b["bias"] if bias else None,
                "silu" if silu else "none", b["residual"] if residual else None), {}
    return arguments


# --- constraints ------------------------------------------------------------------------------

def _quantized_weight(bits: int):
    """int8 [N, K] values in the declared range, [1, g] blocks (g | K; at 4 bits whole 32-column
    chunks), float32 scales [N, K / g], zero points None or int8 like the scales."""
    def check(m: Match) -> Optional[str]:
        qmin, qmax = m.bindings["quant_min"], m.bindings["quant_max"]
        if (qmin, qmax) != WIDTHS[bits]:
            return f"quant range [{qmin}, {qmax}] is not the int{bits} range {list(WIDTHS[bits])}"
        w, s = m.value("weight"), m.value("scale")
        if w.dtype != torch.int8 or w.dim() != 2 or w.device.type != "cpu":
            return f"weight is a rank-{w.dim()} {w.dtype} {w.device} tensor; the kernel takes a CPU int8 [N, K]"
        n, k = w.shape
        g = m.bindings["group_size"]
        if not isinstance(g, int) or g < 1 or k % g:
            return f"block size [1, {g}] does not divide K = {k}"
        if bits == 4 and g % _CHUNK:
            return f"4-bit groups of {g} columns; the packed kernel takes multiples of {_CHUNK}"
        if s.dtype != torch.float32 or tuple(s.shape) not in ((n, k // g),) + (((n,),) if g == k else ()):
            return f"scales are {s.dtype} {tuple(s.shape)}; [1, {g}] blocks of [{n}, {k}] need float32 [{n}, {k // g}]"
        if m.bindings["zero_point"] is not None:
            z = m.value("zero_point")
            if z.dtype != torch.int8 or z.numel() != s.numel():
                return f"zero points are {z.dtype} {tuple(z.shape)}; the kernel takes int8 of the scales' shape"
        return None
    return check


def _rank2(m: Match) -> Optional[str]:
    x = m.value("input")
    return None if x.dim() == 2 else f"input has rank {x.dim()}; the rank-2 rule takes [M, K]"


def quantized_weight_linear_rules(prefix: str, op, lead: tuple = ("input",),
                                  activation=lambda a, nd: a["input"], lead_examples=lambda x: (x,),
                                  checks: tuple = (), weight_operands=None) -> list[Rule]:
    """The 24 rules `{prefix}{8,4}[_nd][_no_bias][_silu|_residual]` of a linear over a dequantized
    int8/int4 weight into `op` (linear_qw's argument list): `activation(bindings, nd)` is what the
    linear reads of the pattern's leading parameters `lead` (the input itself, or an activation
    chain), `lead_examples(x)` their example values, `checks` the constraints on them.
    `weight_operands(bindings, bits)` are the op's weight arguments, made by ops the fuse folds
    (default: q at 8 bits, taken as the op's argument directly, dropping all-zero zero points;
    `pack_int4(q)` at 4)."""
    rules = []
    for nd in (False, True):
        for bias in (True, False):
            for epilogue in ("", "_silu", "_residual"):
                silu, residual = epilogue == "_silu", epilogue == "_residual"
                for bits in (8, 4):
                    name = f"{prefix}{bits}{'_nd' if nd else ''}{'' if bias else '_no_bias'}{epilogue}"
                    check = all_of(tensors(["input"] + (["bias"] if bias else []) + (["residual"] if residual else [])),
                                   output_dtype(torch.float32), *checks, _quantized_weight(bits),
                                   _nd_shapes if nd else _rank2, *((_residual_shape,) if residual else ()))
                    direct = bits == 8 and weight_operands is None
                    replacement = op if direct else _replacement(op, bits, bias, silu, residual, lead,
                                                                 weight_operands or _packed_weight)
                    rules.append(Rule(name, _pattern(nd, bias, silu, residual, lead, activation), replacement,
                                      _examples(nd, bias, residual, lead_examples), check,
                                      _int8_arguments(bias, silu, residual) if direct else None, free_sizes=nd))
    return rules


WEIGHT_ONLY_RULES = quantized_weight_linear_rules("linear_q", LINEAR_QW)
