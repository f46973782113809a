"""Dynamically quantized linears (8da4w, 8da8w): what torchao's `Int8DynamicActivationIntxWeightConfig`
(executorch's llama export, `-qmode 8da4w` / `8da8w`) leaves in the edge dialect around each linear,
as one `etfuse::linear_dq` (backend_ops/dynamic_quant_ops.py):

    torchao.choose_qparams_affine(x, "ASYMMETRIC", [1, K], int8, -128, 127, None, None, int8)
      -> quantize_affine -> dequantize_affine                 (x's rows quantized per token)
    -> the weight-only linear's pattern on that: mm / addmm with
       permute(dequantize_affine(q, [1, g], scale, zp, int8, qmin, qmax))

| rule                                   | edge pattern                                              | replacement                   |
|----------------------------------------|-----------------------------------------------------------|-------------------------------|
| linear_dq{8,4}[_no_bias][_silu]        | mm(dq(x), permute(dequantize_affine(q, ...))) or addmm    | linear_dq(x, q', ...)         |
| linear_dq{8,4}_nd[_no_bias][_silu]     | view(mm(view(dq(x)), permute(dequantize_affine(q)))) or   | linear_dq(x, q', ..., "silu") |
|                                        | addmm [-> mul(., sigmoid(.))]                             |                               |
| linear_dq{8,4}[_nd][_no_bias]_residual | add(either linear above without the SiLU, r) (commutative) | linear_dq(x, q', ..., r)      |

dq(x) is the activation chain above, over the last dimension of a rank-2 (`[1, K]` blocks) or
rank-3 (`[1, 1, K]`) input. {8,4} and the weight's constraints are the weight-only rules'
(patterns/weight_only_rules.py): at 4 bits the replacement is `pack_int4(q)` then the op, which
`etfuse.fuse` folds into a constant, with all-zero zero points dropped
(passes/fold_packed_weights.py); a SwiGLU MLP's two linears join into one
(passes/gated_linears.py). Each rule's pattern contains the weight-only rule's of the same name,
so the larger one is tried first and a dynamically quantized linear never becomes a linear_qw
with its activation chain left beside it (the portable runtime has no kernel for torchao's ops).

The older `quantized_decomposed` per-token spellings (`choose_qparams_per_token_asymmetric`,
`quantize_per_token`, `dequantize_per_token`, `dequantize_per_channel_group`) have no rule:
torchao 0.18 and executorch's llama export no longer write them.
"""

from __future__ import annotations

from typing import Optional

import torch

from etfuse.backend_ops import LINEAR_DQ, PACK_INT4

from .constraints import all_of, output_dtype, tensors
from .linear_rank_rules import linear_nd_shapes as _nd_shapes
from .linear_residual_rules import _residual_shape
from .rule import Match, Rule
from .weight_only_rules import _int8_arguments, _quantized_weight, _rank2, _weight

aten = torch.ops.aten
torchao = torch.ops.torchao


def _quantized_per_token(input, in_features, nd: bool):
    block = [1, 1, in_features] if nd else [1, in_features]
    scale, zero_point = torchao.choose_qparams_affine.default(input, "ASYMMETRIC", block, torch.int8, -128, 127,
                                                              None, None, torch.int8)
    q = torchao.quantize_affine.default(input, block, scale, zero_point, torch.int8, -128, 127)
    return torchao.dequantize_affine.default(q, block, scale, zero_point, torch.int8, -128, 127)


def _pattern(nd: bool, bias: bool, silu: bool, residual: bool = False):
    def linear(input, in_features, w, b, r):
        x = _quantized_per_token(input, in_features, nd)
        flat = aten.view.default(x, [15, 32]) if nd else x
        y = aten.addmm.default(b, flat, w) if bias else aten.mm.default(flat, w)
        y = aten.view.default(y, [3, 5, 6]) if nd else y
        if residual:
            return aten.add.Tensor(y, r)
        return aten.mul.Tensor(y, aten.sigmoid.default(y)) if silu else y

    # one signature per combination: the engine binds a pattern's inputs by their names
    if bias and residual:
        def pattern(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, bias, residual):
            return linear(input, in_features, _weight(weight, group_size, scale, zero_point, quant_min, quant_max),
                          bias, residual)
    elif bias:
        def pattern(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, bias):
            return linear(input, in_features, _weight(weight, group_size, scale, zero_point, quant_min, quant_max),
                          bias, None)
    elif residual:
        def pattern(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, residual):
            return linear(input, in_features, _weight(weight, group_size, scale, zero_point, quant_min, quant_max),
                          None, residual)
    else:
        def pattern(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max):
            return linear(input, in_features, _weight(weight, group_size, scale, zero_point, quant_min, quant_max),
                          None, None)
    return pattern


def _examples(nd: bool, bias: bool, residual: bool = False):
    # distinct scalars (export's literals are found by value): 32 features, group 16, range (-8, 7)
    def examples():
        x = torch.randn(3, 5, 32) if nd else torch.randn(15, 32)
        args = (x, 32, torch.zeros(6, 32, dtype=torch.int8), 16, torch.ones(6, 2), torch.zeros(6, 2, dtype=torch.int8),
                -8, 7)
        return (*args, *((torch.randn(6),) if bias else ()),
                *((torch.randn(3, 5, 6) if nd else torch.randn(15, 6),) if residual else ()))
    return examples


def _int4_replacement(bias: bool, silu: bool, residual: bool = False):
    act = "silu" if silu else "none"

    def dq(input, weight, scale, zero_point, b, r):
        return LINEAR_DQ.aten(input, PACK_INT4.aten(weight), scale, zero_point, 4, b, act, r)

    if bias and residual:
        def replacement(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, bias,
                        residual):
            return dq(input, weight, scale, zero_point, bias, residual)
    elif bias:
        def replacement(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, bias):
            return dq(input, weight, scale, zero_point, bias, None)
    elif residual:
        def replacement(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max, residual):
            return dq(input, weight, scale, zero_point, None, residual)
    else:
        def replacement(input, in_features, weight, group_size, scale, zero_point, quant_min, quant_max):
            return dq(input, weight, scale, zero_point, None, None)
    return replacement


# --- constraints ------------------------------------------------------------------------------

def _per_token(m: Match) -> Optional[str]:
    """The activation's blocks are whole rows: [1, .., 1, K] with K the input's features."""
    x, k = m.value("input"), m.bindings["in_features"]
    if x.dtype != torch.float32:
        return f"input is {x.dtype}; the kernel quantizes float32 rows"
    if k != x.shape[-1]:
        return f"activation blocks of {k} columns are not whole rows of {x.shape[-1]} features (per token)"
    return None


def _rules():
    rules = []
    for nd in (False, True):
        for bias in (True, False):
            for epilogue in ("", "_silu", "_residual"):
                silu, residual = epilogue == "_silu", epilogue == "_residual"
                for bits in (8, 4):
                    name = f"linear_dq{bits}{'_nd' if nd else ''}{'' if bias else '_no_bias'}{epilogue}"
                    check = all_of(tensors(["input"] + (["bias"] if bias else []) + (["residual"] if residual else [])),
                                   output_dtype(torch.float32), _per_token, _quantized_weight(bits),
                                   _nd_shapes if nd else _rank2, *((_residual_shape,) if residual else ()))
                    replacement = LINEAR_DQ if bits == 8 else _int4_replacement(bias, silu, residual)
                    rules.append(Rule(name, _pattern(nd, bias, silu, residual), replacement,
                                      _examples(nd, bias, residual), check,
                                      _int8_arguments(bias, silu, residual) if bits == 8 else None, free_sizes=nd))
    return rules


DYNAMIC_QUANT_RULES = _rules()
