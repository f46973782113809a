"""Quantized fusions: dequantize -> op -> quantize chains into one `quantized_decomposed` op.

| rule                      | edge pattern                                                           | backend op                              |
|---------------------------|------------------------------------------------------------------------|-----------------------------------------|
| add_relu                  | q(relu(add(dq(a), dq(b))))  (commutative, broadcasting)                | quantized_decomposed::add_relu          |
| add                       | q(add(dq(a), dq(b)))                                                   | quantized_decomposed::add               |
| add_scalar                | q(add.Scalar(dq(qa), b))                     b a literal               | quantized_decomposed::add.scalar        |
| add_scalar_lifted         | q(add.Tensor(dq(qa), b))                     b a lifted 0-dim constant | quantized_decomposed::add.scalar        |
| add_scalar_lifted_int     | q(add.Tensor(dq(qa), _to_dim_order_copy(b))) b a lifted int constant   | quantized_decomposed::add.scalar        |
| embedding_byte_affine     | embedding(torchao.dequantize_affine(w, [1, D], scale, zp, int8), idx)  | quantized_decomposed::embedding_byte    |
| embedding_byte            | embedding(dequantize_per_channel(w, scales, zps or None, 0), idx)      | quantized_decomposed::embedding_byte    |

The dq/q dtypes are pattern bindings too (`QuantRule.dtypes`), so one rule covers int8 and uint8
and a dtype mismatch is a *declined* match with its reason in the report, not a silent miss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.fx as fx

from etfuse.backend_ops.quantized_ops import EMBEDDING_BYTE, QUANTIZED_ADD, QUANTIZED_ADD_RELU, QUANTIZED_ADD_SCALAR

from .constraints import all_of
from .rule import EdgePattern, Match, Rule

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
QUANT_DTYPES = (torch.int8, torch.uint8)
_MAX_DIMS = 16  # the kernels' limit (kernels/csrc/core/common.h kMaxDims)


# --- dtype parameters -------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class QuantRule(Rule):
    """A Rule whose dtype literals are parameters too.

    `dtypes` maps parameter names to the (distinct) example dtype each stands for; the pattern
    function takes them as trailing keyword parameters defaulting to those dtypes. After lowering,
    every literal equal to one of them becomes a placeholder, so it binds whatever dtype the graph
    has and the constraint decides.
    """

    dtypes: dict = dataclasses.field(default_factory=dict)

    def bind_literals(self, traced: EdgePattern, replacement: bool = False) -> EdgePattern:
        return _bind_dtypes(self, traced, replacement)


def _bind_dtypes(rule: QuantRule, lowered: EdgePattern, replacement: bool = False) -> EdgePattern:
    if not rule.dtypes:
        return lowered
    by_dtype = {v: k for k, v in rule.dtypes.items()}
    if len(by_dtype) != len(rule.dtypes):
        raise ValueError(f"rule {rule.name!r}: dtype parameters need distinct example dtypes, got {rule.dtypes}")
    graph = lowered.graph
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first_op):
        holders = {name: graph.placeholder(name) for name in rule.dtypes}

    def substitute(a):
        if isinstance(a, (list, tuple)):
            return type(a)(substitute(x) for x in a)
        if isinstance(a, torch.dtype) and a in by_dtype:
            return holders[by_dtype[a]]
        return a

    for n in lowered.ops:
        n.args = substitute(n.args)
        n.kwargs = {k: substitute(v) for k, v in n.kwargs.items()}
    unused = [name for name, p in holders.items() if not p.users]
    if unused and not replacement:
        raise ValueError(f"rule {rule.name!r}: dtype parameters {unused} do not occur in the lowered pattern")
    return EdgePattern(graph, lowered.params + list(rule.dtypes), lowered.anchor, lowered.ops)


# --- patterns ---------------------------------------------------------------------------------

I8, U8, I16 = torch.int8, torch.uint8, torch.int16


def _add_pattern(a, a_scale, a_zero_point, a_quant_min, a_quant_max, b, b_scale, b_zero_point, b_quant_min,
                 b_quant_max, out_scale, out_zero_point, out_quant_min, out_quant_max,
                 a_dtype=I8, b_dtype=U8, out_dtype=I16):
    x = qd.dequantize_per_tensor.default(a, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    y = qd.dequantize_per_tensor.default(b, b_scale, b_zero_point, b_quant_min, b_quant_max, b_dtype)
    return qd.quantize_per_tensor.default(aten.add.Tensor(x, y), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, out_dtype)


def _add_relu_pattern(a, a_scale, a_zero_point, a_quant_min, a_quant_max, b, b_scale, b_zero_point, b_quant_min,
                      b_quant_max, out_scale, out_zero_point, out_quant_min, out_quant_max,
                      a_dtype=I8, b_dtype=U8, out_dtype=I16):
    x = qd.dequantize_per_tensor.default(a, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    y = qd.dequantize_per_tensor.default(b, b_scale, b_zero_point, b_quant_min, b_quant_max, b_dtype)
    return qd.quantize_per_tensor.default(aten.relu.default(aten.add.Tensor(x, y)), out_scale, out_zero_point,
                                          out_quant_min, out_quant_max, out_dtype)


def _binary_examples():
    # Every scalar parameter needs its own example value (that is how export's literals are found).
    return (torch.zeros(2, 3, dtype=I8), 0.11, 3, -120, 121, torch.zeros(2, 3, dtype=U8), 0.13, 5, 2, 250,
            0.17, 7, -30000, 30000)


def _add_scalar_pattern(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, b, out_scale, out_zero_point,
                        out_quant_min, out_quant_max, a_dtype=I8, out_dtype=I16):
    x = qd.dequantize_per_tensor.default(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    return qd.quantize_per_tensor.default(aten.add.Scalar(x, b), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, out_dtype)


def _add_lifted_pattern(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, b, out_scale, out_zero_point,
                        out_quant_min, out_quant_max, a_dtype=I8, out_dtype=I16):
    x = qd.dequantize_per_tensor.default(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    return qd.quantize_per_tensor.default(aten.add.Tensor(x, b), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, out_dtype)


def _add_lifted_int_pattern(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, b, out_scale, out_zero_point,
                            out_quant_min, out_quant_max, a_dtype=I8, out_dtype=I16):
    # `x + 2`: to_edge lifts the int 2 to an int64 0-dim constant and casts it to float32.
    x = qd.dequantize_per_tensor.default(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    bf = aten._to_copy.default(b, dtype=torch.float32)
    return qd.quantize_per_tensor.default(aten.add.Tensor(x, bf), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, out_dtype)


def _scalar_examples(b):
    return lambda: (torch.zeros(2, 3, dtype=I8), 0.11, 3, -120, 121, b, 0.17, 7, -30000, 30000)


def _embedding_affine_pattern(indices, weight, group_size, scale, zero_point, quant_min, quant_max,
                              weight_dtype=I8, output_dtype=torch.float16):
    # output_dtype is written out, so the pattern matches graphs that pass it and graphs that
    # leave the default (float32): the engine compares schema arguments with defaults filled in.
    w = torch.ops.torchao.dequantize_affine.default(weight, [1, group_size], scale, zero_point, weight_dtype,
                                                    quant_min, quant_max, output_dtype)
    return aten.embedding.default(w, indices)


def _embedding_per_channel_pattern(indices, weight, scales, zero_points, quant_min, quant_max, weight_dtype=I8):
    w = qd.dequantize_per_channel.default(weight, scales, zero_points, 0, quant_min, quant_max, weight_dtype)
    return aten.embedding.default(w, indices)


# --- constraints ------------------------------------------------------------------------------

def _literal(m: Match, name: str):
    v = m.bindings[name]
    return None if isinstance(v, fx.Node) else v


def _finite_in_float32(*values: float) -> bool:
    try:
        t = torch.tensor(values, dtype=torch.float64).to(torch.float32)
    except OverflowError:
        return False
    return bool(torch.isfinite(t).all()) and bool((t[:1] > 0).all())


def _qparams(prefix: str, dtype_param: str):
    """scale > 0 and finite, quant range inside the dtype's, zero point inside the quant range."""

    def check(m: Match) -> Optional[str]:
        dtype = m.bindings[dtype_param]
        if dtype not in QUANT_DTYPES:
            return f"{dtype_param} is {dtype}; the kernels take int8 or uint8"
        scale, zp = _literal(m, f"{prefix}_scale"), _literal(m, f"{prefix}_zero_point")
        qmin, qmax = _literal(m, f"{prefix}_quant_min"), _literal(m, f"{prefix}_quant_max")
        if None in (scale, zp, qmin, qmax):
            return f"{prefix} qparams are not literals"
        info = torch.iinfo(dtype)
        if not (info.min <= qmin <= qmax <= info.max):
            return f"{prefix} quant range [{qmin}, {qmax}] is not inside {dtype}'s [{info.min}, {info.max}]"
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            return f"{prefix}_scale is {scale}; it must be finite and > 0"
        if not _finite_in_float32(scale, 1.0 / scale, scale * (info.max - info.min)):
            return f"{prefix}_scale is {scale}; the kernels compute in float32, where scale, 1/scale or (q - zp) * scale is not finite"
        if not qmin <= zp <= qmax:
            return f"{prefix}_zero_point {zp} is outside the quant range [{qmin}, {qmax}]"
        return None

    return check


def _same_dtypes(*names: str):
    def check(m: Match) -> Optional[str]:
        dtypes = [m.bindings[n] for n in names]
        if any(d != dtypes[0] for d in dtypes):
            return "dtypes differ: " + ", ".join(f"{n}={d}" for n, d in zip(names, dtypes)) + "; the kernels take one dtype"
        return None

    return check


def _ranks(*names: str):
    def check(m: Match) -> Optional[str]:
        for n in names:
            v = m.value(n)
            if not isinstance(v, torch.Tensor):
                return f"{n} is not a tensor"
            if v.dim() > _MAX_DIMS:
                return f"{n} has rank {v.dim()}; the kernels take at most {_MAX_DIMS}"
            if v.device.type != "cpu":
                return f"{n} is on {v.device}; the kernels run on cpu"
        return None

    return check


def _scalar_value(m: Match):
    """The added scalar: a literal, or the value of a lifted 0-dim constant (its fake tensor keeps it)."""
    b = m.bindings["b"]
    if not isinstance(b, fx.Node):
        return b if isinstance(b, (int, float)) and not isinstance(b, bool) else None
    if b.op != "placeholder":
        return None
    val = b.meta.get("val")
    const = getattr(val, "constant", None)
    if const is None or const.numel() != 1 or const.dtype == torch.bool or const.is_complex():
        return None
    return const.item()


def _scalar_is_known(m: Match) -> Optional[str]:
    if _scalar_value(m) is None:
        b = m.bindings["b"]
        what = b.name if isinstance(b, fx.Node) else repr(b)
        return f"the added value {what} is not a scalar literal or a lifted constant with a known value"
    return None


def _embedding(scale_name: str, zp_name: Optional[str]):
    def check(m: Match) -> Optional[str]:
        w, s = m.value("weight"), m.value(scale_name)
        if w.dim() != 2:
            return f"weight has rank {w.dim()}; embedding_byte takes [N, D]"
        n = w.shape[0]
        if s.dtype not in (torch.float32, torch.float16):
            return f"scales have dtype {s.dtype}; the kernel takes float32 or float16"
        if tuple(s.shape) not in ((n,), (n, 1)):
            return f"scales have shape {tuple(s.shape)}; per-row scales are [{n}] or [{n}, 1]"
        if zp_name is not None and m.bindings[zp_name] is not None:
            z = m.value(zp_name)
            if tuple(z.shape) not in ((n,), (n, 1)):
                return f"zero points have shape {tuple(z.shape)}; per-row zero points are [{n}] or [{n}, 1]"
            if z.dtype == torch.bool or z.is_complex():
                return f"zero points have dtype {z.dtype}"
        out = m.anchor_value
        if out.dtype != s.dtype:
            return f"the embedding is {out.dtype} but the scales are {s.dtype}; embedding_byte returns the scales' dtype"
        idx = m.value("indices")
        if idx.dtype not in (torch.int64, torch.int32):
            return f"indices have dtype {idx.dtype}"
        if idx.dim() + 1 > _MAX_DIMS:
            return f"indices have rank {idx.dim()}"
        qmin, qmax = _literal(m, "quant_min"), _literal(m, "quant_max")
        info = torch.iinfo(m.bindings["weight_dtype"])
        if qmin is None or qmax is None or not (info.min <= qmin <= qmax <= info.max):
            return f"quant range [{qmin}, {qmax}] is not inside {m.bindings['weight_dtype']}'s"
        return None

    return check


def _weight_dtype(m: Match) -> Optional[str]:
    if m.bindings["weight_dtype"] not in QUANT_DTYPES or m.value("weight").dtype != m.bindings["weight_dtype"]:
        return f"weight dtype is {m.bindings['weight_dtype']}; embedding_byte takes int8 or uint8"
    return None


def _per_row(m: Match) -> Optional[str]:
    if m.bindings["group_size"] != m.value("weight").shape[1]:
        return f"block size [1, {m.bindings['group_size']}] is not per row (weight {tuple(m.value('weight').shape)})"
    return None


# --- replacement arguments --------------------------------------------------------------------

def _add_scalar_arguments(m: Match):
    b = m.bindings
    return ((b["qa"], b["a_scale"], b["a_zero_point"], b["a_quant_min"], b["a_quant_max"], b["a_dtype"],
             _scalar_value(m), b["out_scale"], b["out_zero_point"], b["out_quant_min"], b["out_quant_max"],
             b["out_dtype"]), {})


def _embedding_arguments(scale_name: str, zp_name: Optional[str]):
    def arguments(m: Match):
        b = m.bindings
        zp = b[zp_name] if zp_name else None
        return ((b["weight"], b[scale_name], zp, b["quant_min"], b["quant_max"], b["indices"]), {})

    return arguments


_BINARY_DTYPES = {"a_dtype": I8, "b_dtype": U8, "out_dtype": I16}
_SCALAR_DTYPES = {"a_dtype": I8, "out_dtype": I16}

_binary_check = all_of(_same_dtypes("a_dtype", "b_dtype", "out_dtype"), _qparams("a", "a_dtype"),
                       _qparams("b", "b_dtype"), _qparams("out", "out_dtype"), _ranks("a", "b"))
_scalar_check = all_of(_same_dtypes("a_dtype", "out_dtype"), _qparams("a", "a_dtype"), _qparams("out", "out_dtype"),
                       _ranks("qa"), _scalar_is_known)


def _scalar_rule(name, pattern, b_example):
    return QuantRule(name, pattern, QUANTIZED_ADD_SCALAR, _scalar_examples(b_example), _scalar_check,
                     _add_scalar_arguments, dtypes=_SCALAR_DTYPES)


QUANT_RULES = [
    QuantRule("add_relu", _add_relu_pattern, QUANTIZED_ADD_RELU, _binary_examples, _binary_check,
              dtypes=_BINARY_DTYPES),
    QuantRule("add", _add_pattern, QUANTIZED_ADD, _binary_examples, _binary_check, dtypes=_BINARY_DTYPES),
    _scalar_rule("add_scalar", _add_scalar_pattern, 0.37),
    _scalar_rule("add_scalar_lifted", _add_lifted_pattern, torch.tensor(0.37)),
    _scalar_rule("add_scalar_lifted_int", _add_lifted_int_pattern, torch.tensor(2)),
    QuantRule("embedding_byte_affine", _embedding_affine_pattern, EMBEDDING_BYTE,
              lambda: (torch.tensor([1, 2]), torch.zeros(10, 7, dtype=I8), 7, torch.ones(10, 1, dtype=torch.float16),
                       torch.zeros(10, 1, dtype=I8), -127, 126),
              all_of(_weight_dtype, _per_row, _embedding("scale", "zero_point")),
              _embedding_arguments("scale", "zero_point"), dtypes={"weight_dtype": I8, "output_dtype": torch.float16}),
    QuantRule("embedding_byte", _embedding_per_channel_pattern, EMBEDDING_BYTE,
              lambda: (torch.tensor([1, 2]), torch.zeros(10, 7, dtype=I8), torch.ones(10), torch.zeros(10),
                       -127, 126),
              all_of(_weight_dtype, _embedding("scales", "zero_points")),
              _embedding_arguments("scales", "zero_points"), dtypes={"weight_dtype": I8}),
]
