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
(patterns/weight_only_rules.py). The replacement is the op over q (at 4 bits `pack_int4(q)`) and
`weight_row_sums(q, scale, zero_point)` (the dequantized rows' sums, which the kernel reads), both of which
`etfuse.fuse` folds into constants, with all-zero zero points dropped
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

from etfuse.backend_ops import LINEAR_DQ, WEIGHT_ROW_SUMS

from .rule import Match
from .weight_only_rules import _packed_weight, quantized_weight_linear_rules

aten = torch.ops.aten
torchao = torch.ops.torchao


def _quantized_per_token(a: dict, nd: bool):
    """The input's rows quantized and dequantized per token: torchao's chain before each linear."""
    input, in_features = a["input"], a["in_features"]
    block = [1, 1, in_features] if nd else [1, in_features]
    scale, zero_point = torchao.choose_qparams_affine.default(input, "ASYMMETRIC", block, torch.int8, -128, 127,
                                                              None, None, torch.int8)
    q = torchao.quantize_affine.default(input, block, scale, zero_point, torch.int8, -128, 127)
    return torchao.dequantize_affine.default(q, block, scale, zero_point, torch.int8, -128, 127)


# --- constraints ------------------------------------------------------------------------------

def _per_token(m: Match) -> Optional[str]:
    """The activation's blocks are whole rows: [1, .., 1, K] with K the input's features."""
    x, k = m.value("input"), m.bindings["in_features"]
    if x.dtype != torch.float32:
        return f"input is {x.dtype}; the kernel quantizes float32 rows"
    if k != x.shape[-1]:
        return f"activation blocks of {k} columns are not whole rows of {x.shape[-1]} features (per token)"
    return None


def _weight_and_row_sums(a: dict, bits: int) -> tuple:
    """q (pack_int4(q) at 4 bits) and its dequantized rows' sums, which the kernel subtracts zx times."""
    return (*_packed_weight(a, bits), WEIGHT_ROW_SUMS.aten(a["weight"], a["scale"], a["zero_point"]))


DYNAMIC_QUANT_RULES = quantized_weight_linear_rules(
    "linear_dq", LINEAR_DQ, lead=("input", "in_features"), activation=_quantized_per_token,
    lead_examples=lambda x: (x, 32), checks=(_per_token,), weight_operands=_weight_and_row_sums)
