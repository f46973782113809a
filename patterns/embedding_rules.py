"""Quantized embedding fusions: embedding(dequantize(table), indices) into one
`quantized_decomposed::embedding_{byte,4bit,2bit}[.dtype]` op.

| rule                               | edge pattern                                                                      | replacement                                      |
|------------------------------------|-----------------------------------------------------------------------------------|--------------------------------------------------|
| embedding_{w}_affine[_dtype]       | embedding(torchao.dequantize_affine(w, [1, g], scale, zp, int8, qmin, qmax, out), idx) | embedding_{w}[.dtype](pack(w), scale, zp, ...) |
| embedding_{w}_group[_dtype]        | embedding(dequantize_per_channel_group(w, scales, zps, qmin, qmax, int8, g, out), idx) | the same                                      |
| embedding_byte_group_int8_zp       | the group pattern at 8 bits, int8 zero points                                     | etfuse::embedding_byte_int8_zp(w, scale, zp, ...) |
| embedding_{4bit,2bit}_group_int8_zp | the group pattern at 4 / 2 bits, int8 zero points                                | etfuse::embedding_{w}_int8_zp(pack(w), scale, zp, ...) |
| embedding_byte                     | embedding(dequantize_per_channel(w, scales, zps or None, 0), idx)                 | embedding_byte                                   |

{w} is the width the quant range declares: (qmin, qmax) = (-128, 127) byte, (-8, 7) 4bit, (-2, 1)
2bit. Sub-byte replacements are functions: `quant_fusion._pack_embedding_weight(w, bits)` then the
op; `etfuse.fuse` / `transform(default_passes())` fold the packing into a constant afterwards
(passes/fold_packed_weights.py). Each has a `_nozp` twin that passes no zero points, taken when
every zero point is known to be 0 (`Match.constant`: a lifted constant or the pass's
`node_value_dict`; symmetric quantization), as executorch does. The byte rules pass None
themselves (a BackendOp replacement with `arguments`).

Which op: the functional one when the output is float32 from float32 scales (a float32 model),
`.dtype` otherwise (torchao passes `output_dtype` exactly then; executorch's rules pick the same).

The fused ops compute `(float32(q) - float32(zp)) * float32(scale)` rounded once to the output
dtype (backend_ops/embedding_ops.py). The dequantize ops round in their own dtypes; the
constraints accept a match only where both give the same bits: integer zero points small enough
that `q - zp` is exact in the dtype the pattern subtracts in (float zero points: known
integer values, or float32 throughout), and for `dequantize_per_channel_group` (which rounds the
product to the scales' dtype before casting) float32 scales or an output of the scales' dtype.

`dequantize_per_channel_group` subtracts int8 zero points from int8 values in int8, and torch wraps
(127 - -128 gives -1). At 8 bits every int8 zero point may do that, so embedding_byte_group_int8_zp
(which outranks embedding_byte_group[_dtype]) takes int8 zero points whatever their values: its op
subtracts in int8 as the pattern does. The choice rests on dtypes alone, so a graph module without
values (`ExecutorchBackendConfig(passes=...)`) and `etfuse.fuse` write the same op; all-zero
constant zero points go afterwards (FoldPackedWeightsPass), as for the other embedding ops.

At 4 and 2 bits an int8 zero point may wrap q - zp too when it lies outside the width's range
(legal: the ops take any int8). embedding_{4bit,2bit}_group_int8_zp (which outrank the plain and
`_nozp` group rules) take int8 zero points whatever their values, all 0 included, as at 8 bits, and write
`etfuse::embedding_{4bit,2bit}_int8_zp` on the packed table (wrapping as the pattern does): a choice
on values would give `etfuse.fuse`, which sees them, another op than `edge.transform` and the
config route, which do not (the fuzz run found that). dequantize_affine subtracts in the output dtype, where
|q - zp| <= 136 is exact: its rules fuse int8 zero points of any value.
"""

from __future__ import annotations

from typing import Optional

import torch

from etfuse.backend_ops.embedding_ops import (
    EMBEDDING_2BIT, EMBEDDING_2BIT_DTYPE, EMBEDDING_4BIT, EMBEDDING_4BIT_DTYPE, EMBEDDING_BYTE, EMBEDDING_BYTE_DTYPE,
    EMBEDDING_2BIT_INT8_ZP, EMBEDDING_4BIT_INT8_ZP, EMBEDDING_BYTE_INT8_ZP,
)

from .constraints import all_of
from .quant_rules import QuantRule
from .rule import Match

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
I8, F16, F32, BF16 = torch.int8, torch.float16, torch.float32, torch.bfloat16
_MAX_DIMS = 16  # the kernels' limit (kernels/csrc/core/common.h kMaxDims)

WIDTHS = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}  # bits -> the quant range that declares them
_NAMES = {8: "byte", 4: "4bit", 2: "2bit"}
_OPS = {(8, False): EMBEDDING_BYTE, (8, True): EMBEDDING_BYTE_DTYPE, (4, False): EMBEDDING_4BIT,
        (4, True): EMBEDDING_4BIT_DTYPE, (2, False): EMBEDDING_2BIT, (2, True): EMBEDDING_2BIT_DTYPE}
_INT8_ZP_OPS = {8: EMBEDDING_BYTE_INT8_ZP, 4: EMBEDDING_4BIT_INT8_ZP, 2: EMBEDDING_2BIT_INT8_ZP}
# the largest integer magnitude each output dtype holds exactly (all smaller ones too)
_EXACT = {F32: 2 ** 24, F16: 2048, BF16: 256}


# --- patterns ---------------------------------------------------------------------------------

def _affine_pattern(indices, weight, group_size, scale, zero_point, quant_min, quant_max,
                    weight_dtype=I8, output_dtype=F16):
    # output_dtype is written out, so the pattern matches graphs that pass it and graphs that
    # leave the default (float32): the engine compares schema arguments with defaults filled in.
    w = torch.ops.torchao.dequantize_affine.default(weight, [1, group_size], scale, zero_point, weight_dtype,
                                                    quant_min, quant_max, output_dtype)
    return aten.embedding.default(w, indices)


def _group_pattern(indices, weight, group_size, scale, zero_point, quant_min, quant_max,
                   weight_dtype=I8, output_dtype=F16):
    w = qd.dequantize_per_channel_group.default(weight, scale, zero_point, quant_min, quant_max, weight_dtype,
                                                group_size, output_dtype)
    return aten.embedding.default(w, indices)


def _per_channel_pattern(indices, weight, scales, zero_points, quant_min, quant_max, weight_dtype=I8):
    w = qd.dequantize_per_channel.default(weight, scales, zero_points, 0, quant_min, quant_max, weight_dtype)
    return aten.embedding.default(w, indices)


def _examples():
    # Distinct scalar examples (that is how export's literals are found), none equal to a packing
    # width the replacements write (4, 2): group 8 of 16 columns, range (-8, 7).
    return (torch.tensor([1, 2]), torch.zeros(10, 16, dtype=I8), 8, torch.ones(10, 2, dtype=F16),
            torch.zeros(10, 2, dtype=I8), -8, 7)


def _replacement(bits: int, dtype_variant: bool, zero_points: bool):
    op = _OPS[(bits, dtype_variant)]

    def replacement(indices, weight, group_size, scale, zero_point, quant_min, quant_max,
                    weight_dtype=I8, output_dtype=F16):
        packed = torch.ops.quant_fusion._pack_embedding_weight.default(weight, bits)
        zp = zero_point if zero_points else None
        if dtype_variant:
            return op.aten(packed, scale, zp, quant_min, quant_max, indices, dtype=output_dtype)
        return op.aten(packed, scale, zp, quant_min, quant_max, indices)

    return replacement


def _int8_zp_replacement(bits: int):
    op = _INT8_ZP_OPS[bits]

    def replacement(indices, weight, group_size, scale, zero_point, quant_min, quant_max,
                    weight_dtype=I8, output_dtype=F16):
        packed = torch.ops.quant_fusion._pack_embedding_weight.default(weight, bits)
        return op.aten(packed, scale, zero_point, quant_min, quant_max, indices, dtype=output_dtype)

    return replacement


# --- constraints ------------------------------------------------------------------------------

def _literal(m: Match, name: str):
    v = m.bindings[name]
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _zero_points_all_zero(m: Match, name: str) -> bool:
    z = m.constant(name)
    return z is not None and bool((z == 0).all())


def _width(bits: int):
    def check(m: Match) -> Optional[str]:
        qmin, qmax = _literal(m, "quant_min"), _literal(m, "quant_max")
        if (qmin, qmax) != WIDTHS[bits]:
            return f"quant range [{qmin}, {qmax}] is not embedding_{_NAMES[bits]}'s {list(WIDTHS[bits])}"
        return None

    return check


def _table(bits: int):
    """int8 [N, D] values, block [1, g] with g | D, scales [N], [N, 1] or [N, D / g] of a float
    dtype, zero points None or the scales' shape, int indices; D packs whole bytes."""

    def check(m: Match) -> Optional[str]:
        w, s = m.value("weight"), m.value("scale")
        if m.bindings["weight_dtype"] != I8 or w.dtype != I8:
            return f"weight is {w.dtype} (declared {m.bindings['weight_dtype']}); the rule takes int8 values"
        if w.dim() != 2 or w.device.type != "cpu":
            return f"weight is a rank-{w.dim()} {w.device} tensor; the kernel takes a CPU [N, D] table"
        n, d = w.shape
        g = m.bindings["group_size"]
        if not isinstance(g, int) or g < 1 or d % g:
            return f"block size [1, {g}] does not divide D = {d}"
        per_byte = 8 // bits
        if d % per_byte:
            return f"D = {d} does not pack into whole bytes at {bits} bits"
        groups = d // g
        if s.dtype not in _EXACT:
            return f"scales have dtype {s.dtype}; the kernel takes float32, float16 or bfloat16"
        if s.numel() != n * groups or s.dim() not in (1, 2) or s.shape[0] != n or (s.dim() == 1 and groups != 1):
            return f"scales have shape {tuple(s.shape)}; [1, {g}] blocks of a [{n}, {d}] table need [{n}, {groups}]"
        if m.bindings["zero_point"] is not None:
            z = m.value("zero_point")
            if tuple(z.shape) != tuple(s.shape) and not (groups == 1 and z.numel() == n and z.dim() in (1, 2)):
                return f"zero points have shape {tuple(z.shape)}, the scales {tuple(s.shape)}"
            if z.dtype == torch.bool or z.is_complex():
                return f"zero points have dtype {z.dtype}"
        idx = m.value("indices")
        if idx.dtype not in (torch.int64, torch.int32) or idx.dim() + 1 > _MAX_DIMS:
            return f"indices are a rank-{idx.dim()} {idx.dtype} tensor; the kernel takes int64/int32, rank < {_MAX_DIMS}"
        return None

    return check


def _zero_point_bound(m: Match) -> Optional[tuple[float, bool]]:
    """(largest |zp|, all integer-valued) when known from the values or the dtype, else None.
    Integer zero points wider than int8 whose values the pass cannot see (the config route) are taken
    to lie in the quant range, as quantizers make them and as the group rules take them: bounded by
    their dtype alone, an int32 zero point would keep every route but etfuse.fuse's from fusing."""
    if m.bindings["zero_point"] is None:
        return 0.0, True
    z = m.constant("zero_point")
    if z is not None:
        z = z.double()
        return (float(z.abs().max()) if z.numel() else 0.0), bool((z == z.round()).all())
    dt = m.value("zero_point").dtype
    if dt.is_floating_point:
        return None
    info = torch.iinfo(dt)
    qmin, qmax = _literal(m, "quant_min"), _literal(m, "quant_max")
    if info.bits > 8 and qmin is not None and qmax is not None:
        return float(max(-qmin, qmax)), True
    return float(max(-info.min, info.max)), True


def _exact_subtraction(m: Match, in_dtype) -> Optional[str]:
    """q - zp (|q| <= 128) is exact when computed in `in_dtype`."""
    all_f32 = m.value("scale").dtype == F32 and m.anchor_value.dtype == F32 and (
        m.bindings["zero_point"] is None or m.value("zero_point").dtype == F32)
    if all_f32:
        return None  # the same float32 operations, whatever the zero points
    bound = _zero_point_bound(m)
    if bound is None:
        return ("zero points are float with values unknown at fuse time; the fused op is exact for "
                "integer zero points (pass node_value_dict, or keep the weights as constants)")
    largest, integral = bound
    if not integral:
        return "zero points are not integers; the pattern rounds q - zp in its dtype, the kernel in float32"
    if 128 + largest > _EXACT.get(in_dtype, 0):
        return f"zero points up to {largest:g} make q - zp inexact in {in_dtype}"
    return None


def _affine_exact(m: Match) -> Optional[str]:
    # dequantize_affine: q.to(out) - zp.to(out), times scale (promoted), .to(out)
    return _exact_subtraction(m, m.anchor_value.dtype)


def _zero_point_dtype(m: Match):
    """The zero points' dtype; no zero points subtract as int32 zeros would."""
    return m.value("zero_point").dtype if m.bindings["zero_point"] is not None else torch.int32


def _group_product(m: Match):
    """The dtype dequantize_per_channel_group multiplies (q - zp) by the scales in, and whether the
    fused op's single rounding gives its bits (None) or why not."""
    s, out = m.value("scale").dtype, m.anchor_value.dtype
    z = _zero_point_dtype(m)
    product = s if not z.is_floating_point or z == s else torch.promote_types(z, s)
    if product not in (F32, out):
        return product, f"the pattern rounds (q - zp) * scale to {product} before the {out} output; the kernel rounds once"
    return product, None


def _group_exact(m: Match) -> Optional[str]:
    # dequantize_per_channel_group: (q - zp) in zp's dtype (int: exact), times scales in the
    # promoted dtype, rounded there, then .to(out): one rounding only if that dtype is float32 or out's.
    product, why = _group_product(m)
    if why:
        return why
    z = _zero_point_dtype(m)
    if z.is_floating_point:
        return _exact_subtraction(m, z)
    wrap = _integer_subtraction_wraps(m, torch.promote_types(m.value("weight").dtype, z))
    if wrap:
        return wrap
    return _exact_subtraction(m, product) if product != F32 else None


def _integer_subtraction_wraps(m: Match, in_dtype) -> Optional[str]:
    """q - zp computed in the integer `in_dtype` (an int8 zero point keeps int8 weights in int8)
    wraps unless every difference fits; embedding_{byte,4bit,2bit} subtract exactly. int8 zero
    points whose values the pass cannot see (a graph module alone, as `ExecutorchBackendConfig.passes`
    get it) may lie anywhere in int8: embedding_{byte,4bit,2bit}_group_int8_zp's, whose ops wrap
    as the pattern does. Wider int zero points unseen are taken to lie in the quant range, as
    quantizers make them (q - zp then fits int16)."""
    qmin, qmax = _literal(m, "quant_min"), _literal(m, "quant_max")
    if qmin is None or qmax is None:
        return f"quant range [{qmin}, {qmax}] is not literal"
    info = torch.iinfo(in_dtype)
    z = m.constant("zero_point") if m.bindings["zero_point"] is not None else torch.zeros(1)
    if z is None and in_dtype == I8:
        return ("int8 zero points unseen may make q - zp wrap in int8 where the pattern subtracts; "
                "the _int8_zp rule's op wraps as it does")
    if z is None:
        zmin, zmax = qmin, qmax
    else:
        zmin, zmax = (int(z.min()), int(z.max())) if z.numel() else (0, 0)
    if qmin - zmax < info.min or qmax - zmin > info.max:
        return (f"q - zp may wrap in {in_dtype} (quant range [{qmin}, {qmax}], zero points in [{zmin}, {zmax}]) "
                "where the pattern subtracts; the fused op subtracts exactly")
    return None


def _int8_difference(m: Match) -> Optional[str]:
    """embedding_byte_group_int8_zp: int8 values and int8 zero points (their values are not looked
    at: the op wraps as the pattern does for all), a product rounded once (an int8 difference times
    a float32, float16 or bfloat16 scale is exact in float32), an output the kernel writes."""
    w, z = m.value("weight").dtype, m.value("zero_point").dtype if m.bindings["zero_point"] is not None else None
    if w != I8 or z != I8:
        return f"weight {w}, zero points {z}: the op takes int8 values and int8 zero points"
    if m.anchor_value.dtype not in _EXACT:
        return f"the output is {m.anchor_value.dtype}; the kernel writes float32, float16 or bfloat16"
    return _group_product(m)[1]


def _int8_zp_arguments(m: Match):
    b = m.bindings
    return ((b["weight"], b["scale"], b["zero_point"], b["quant_min"], b["quant_max"], b["indices"]),
            {"dtype": b["output_dtype"]})


def _variant(dtype_variant: bool):
    """The functional op for a float32 output of float32 scales, `.dtype` for every other."""

    def check(m: Match) -> Optional[str]:
        out, s = m.anchor_value.dtype, m.value("scale").dtype
        plain = out == F32 and s == F32
        if plain and dtype_variant:
            return "a float32 output of float32 scales is the functional op's (the rule without _dtype)"
        if not plain and not dtype_variant:
            return f"a {out} output of {s} scales is the .dtype variant's (the _dtype rule)"
        return None

    return check


def _no_zero_points(m: Match) -> Optional[str]:
    if m.bindings["zero_point"] is not None and not _zero_points_all_zero(m, "zero_point"):
        return "zero points are not known to be all 0"
    return None


# --- replacement arguments (byte) -------------------------------------------------------------

def _byte_arguments(dtype_variant: bool):
    def arguments(m: Match):
        b = m.bindings
        zp = None if _zero_points_all_zero(m, "zero_point") else b["zero_point"]
        args = (b["weight"], b["scale"], zp, b["quant_min"], b["quant_max"], b["indices"])
        return args, ({"dtype": b["output_dtype"]} if dtype_variant else {})

    return arguments


def _per_channel_arguments(m: Match):
    b = m.bindings
    return (b["weight"], b["scales"], b["zero_points"], b["quant_min"], b["quant_max"], b["indices"]), {}


def _per_channel_check(m: Match) -> Optional[str]:
    """The per-row byte rule as it was: int8/uint8 [N, D], per-row float32/float16 scales, the
    scales' dtype out."""
    w, s = m.value("weight"), m.value("scales")
    if m.bindings["weight_dtype"] not in (I8, torch.uint8) or w.dtype != m.bindings["weight_dtype"]:
        return f"weight dtype is {m.bindings['weight_dtype']}; embedding_byte takes int8 or uint8"
    if w.dim() != 2:
        return f"weight has rank {w.dim()}; embedding_byte takes [N, D]"
    n = w.shape[0]
    if s.dtype not in (F32, F16):
        return f"scales have dtype {s.dtype}; the kernel takes float32 or float16"
    if tuple(s.shape) not in ((n,), (n, 1)):
        return f"scales have shape {tuple(s.shape)}; per-row scales are [{n}] or [{n}, 1]"
    if m.bindings["zero_points"] is not None:
        z = m.value("zero_points")
        if tuple(z.shape) not in ((n,), (n, 1)):
            return f"zero points have shape {tuple(z.shape)}; per-row zero points are [{n}] or [{n}, 1]"
        if z.dtype == torch.bool or z.is_complex():
            return f"zero points have dtype {z.dtype}"
    if m.anchor_value.dtype != s.dtype:
        return f"the embedding is {m.anchor_value.dtype} but the scales are {s.dtype}; embedding_byte returns the scales' dtype"
    idx = m.value("indices")
    if idx.dtype not in (torch.int64, torch.int32) or idx.dim() + 1 > _MAX_DIMS:
        return f"indices are a rank-{idx.dim()} {idx.dtype} tensor"
    qmin, qmax = _literal(m, "quant_min"), _literal(m, "quant_max")
    info = torch.iinfo(m.bindings["weight_dtype"])
    if qmin is None or qmax is None or not (info.min <= qmin <= qmax <= info.max):
        return f"quant range [{qmin}, {qmax}] is not inside {m.bindings['weight_dtype']}'s"
    return None


# --- rules ------------------------------------------------------------------------------------

class EmbeddingRule(QuantRule):
    """A QuantRule whose function replacement is lowered once per function, not once per rule:
    the affine and the group forms of one (width, variant) share it (the same parameters, example
    inputs and dtype parameters), which halves what preparing the rules costs (each lowering is
    an export and a `to_edge`, about a second)."""

    def replacement_graph(self):
        if self.replacement not in _SHARED_REPLACEMENTS:
            _SHARED_REPLACEMENTS[self.replacement] = super().replacement_graph()
        return _SHARED_REPLACEMENTS[self.replacement]


_SHARED_REPLACEMENTS: dict = {}
# --- the table --------------------------------------------------------------------------------

_DTYPES = {"weight_dtype": I8, "output_dtype": F16}
_FORMS = {"affine": (_affine_pattern, _affine_exact), "group": (_group_pattern, _group_exact)}


def _rules():
    replacements = {(bits, variant, zps): _replacement(bits, variant, zps)
                    for bits in (4, 2) for variant in (False, True) for zps in (False, True)}
    rules = []
    for form, (pattern, exact) in _FORMS.items():
        for bits in (8, 4, 2):
            for dtype_variant in (False, True):
                name = f"embedding_{_NAMES[bits]}_{form}{'_dtype' if dtype_variant else ''}"
                check = all_of(_width(bits), _table(bits), _variant(dtype_variant), exact)
                if bits == 8:
                    rules.append(QuantRule(name, pattern, _OPS[(8, dtype_variant)], _examples, check,
                                           _byte_arguments(dtype_variant), dtypes=_DTYPES))
                    continue
                rules.append(EmbeddingRule(f"{name}_nozp", pattern, replacements[(bits, dtype_variant, False)],
                                           _examples, all_of(check, _no_zero_points), outranks=(name,), dtypes=_DTYPES))
                rules.append(EmbeddingRule(name, pattern, replacements[(bits, dtype_variant, True)], _examples, check,
                                           dtypes=_DTYPES))
    rules.append(QuantRule("embedding_byte_group_int8_zp", _group_pattern, EMBEDDING_BYTE_INT8_ZP, _examples,
                           all_of(_width(8), _table(8), _int8_difference), _int8_zp_arguments,
                           outranks=("embedding_byte_group", "embedding_byte_group_dtype"), dtypes=_DTYPES))
    for bits in (4, 2):
        rules.append(EmbeddingRule(f"embedding_{_NAMES[bits]}_group_int8_zp", _group_pattern, _int8_zp_replacement(bits),
                                   _examples, all_of(_width(bits), _table(bits), _int8_difference),
                                   outranks=tuple(f"embedding_{_NAMES[bits]}_group{v}{z}" for v in ("", "_dtype") for z in ("", "_nozp")),
                                   dtypes=_DTYPES))
    return rules


EMBEDDING_RULES = [
    *_rules(),
    QuantRule("embedding_byte", _per_channel_pattern, EMBEDDING_BYTE,
              lambda: (torch.tensor([1, 2]), torch.zeros(10, 7, dtype=I8), torch.ones(10), torch.zeros(10), -127, 126),
              _per_channel_check, _per_channel_arguments, dtypes={"weight_dtype": I8}),
]
