"""Quantized fusions: dequantize -> add -> quantize chains into one `quantized_decomposed` op
(`QUANTIZED_ADD_RULES`; the embeddings are in embedding_rules.py, and `etfuse.patterns.QUANT_RULES`,
what `QuantFusionPass` runs, holds both).

| rule                      | edge pattern                                                           | backend op                              |
|---------------------------|------------------------------------------------------------------------|-----------------------------------------|
| add_relu                  | q(relu(add(dq(a), dq(b))))  (commutative, broadcasting)                | quantized_decomposed::add_relu          |
| add                       | q(add(dq(a), dq(b)))                                                   | quantized_decomposed::add               |
| add_scalar                | q(add.Scalar(dq(qa), b))                     b a literal               | quantized_decomposed::add.scalar        |
| add_scalar_lifted         | q(add.Tensor(dq(qa), b))                     b a lifted 0-dim constant | quantized_decomposed::add.scalar        |
| add_scalar_lifted_int     | q(add.Tensor(dq(qa), _to_dim_order_copy(b))) b a lifted int constant   | quantized_decomposed::add.scalar        |

The dq/q dtypes are pattern bindings too (`QuantRule.dtypes`), so one rule covers int8 and uint8
and a dtype mismatch is a *declined* match with its reason in the report, not a silent miss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.fx as fx

from etfuse.backend_ops.quantized_ops import QUANTIZED_ADD, QUANTIZED_ADD_RELU, QUANTIZED_ADD_SCALAR

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


def qparams_check(prefix: str, dtype_param: str):
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


def same_dtypes(*names: str):
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


# --- replacement arguments --------------------------------------------------------------------

def _add_scalar_arguments(m: Match):
    b = m.bindings
    return ((b["qa"], b["a_scale"], b["a_zero_point"], b["a_quant_min"], b["a_quant_max"], b["a_dtype"],
             _scalar_value(m), b["out_scale"], b["out_zero_point"], b["out_quant_min"], b["out_quant_max"],
             b["out_dtype"]), {})


_BINARY_DTYPES = {"a_dtype": I8, "b_dtype": U8, "out_dtype": I16}
_SCALAR_DTYPES = {"a_dtype": I8, "out_dtype": I16}

_binary_check = all_of(same_dtypes("a_dtype", "b_dtype", "out_dtype"), qparams_check("a", "a_dtype"),
                       qparams_check("b", "b_dtype"), qparams_check("out", "out_dtype"), _ranks("a", "b"))
_scalar_check = all_of(same_dtypes("a_dtype", "out_dtype"), qparams_check("a", "a_dtype"), qparams_check("out", "out_dtype"),
                       _ranks("qa"), _scalar_is_known)


def _scalar_rule(name, pattern, b_example):
    return QuantRule(name, pattern, QUANTIZED_ADD_SCALAR, _scalar_examples(b_example), _scalar_check,
                     _add_scalar_arguments, dtypes=_SCALAR_DTYPES)


QUANTIZED_ADD_RULES = [
    QuantRule("add_relu", _add_relu_pattern, QUANTIZED_ADD_RELU, _binary_examples, _binary_check,
              dtypes=_BINARY_DTYPES),
    QuantRule("add", _add_pattern, QUANTIZED_ADD, _binary_examples, _binary_check, dtypes=_BINARY_DTYPES),
    _scalar_rule("add_scalar", _add_scalar_pattern, 0.37),
    _scalar_rule("add_scalar_lifted", _add_lifted_pattern, torch.tensor(0.37)),
    _scalar_rule("add_scalar_lifted_int", _add_lifted_int_pattern, torch.tensor(2)),
]
