"""QuantFusionPass: dequantize -> add [-> relu] -> quantize and dequantize -> embedding into
`quantized_decomposed` ops (rules in patterns/quant_rules.py), int8 and uint8.

The quantized rules of the one rule table, alone: `default_passes()` runs them with every other
rule in one `FusionPass`. Shared dequantize nodes are split per use first, on a copy
(passes/split_dequantize.py); if nothing fuses the result is a plain copy of the caller's module.
"""

from __future__ import annotations

from etfuse.patterns import QUANT_RULES

from .fusion_pass import FusionPass


class QuantFusionPass(FusionPass):
    """Fuses quantized add / add_relu / add.scalar / embedding chains (see patterns/quant_rules.py)."""

    def __init__(self, near_misses: bool = False):
        super().__init__(QUANT_RULES, near_misses)
