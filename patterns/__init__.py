"""Fusion rules as data: one module per family, and `RULES`, the one table the fusion pass runs.

Which rule wins where two could match is data too: a match that ends later in the graph is
taken first (the engine sweeps consumers first), and among rules ending at the same op a rule's
`outranks` names the ones it is tried before, otherwise the larger pattern first
(passes/engine.py). No rule depends on the order of the families below.
"""

from .rule import Constraint, EdgePattern, Match, PatternError, Rule, edge_patterns
from .trace import trace_edge_pattern, trace_edge_patterns
from .float_rules import FLOAT_RULES
from .quant_rules import QUANTIZED_ADD_RULES, QuantRule
from .embedding_rules import EMBEDDING_RULES
from .gemm_conv_rules import GEMM_CONV_RULES
from .quantized_gemm_rules import QUANTIZED_GEMM_RULES
from .linear_rank_rules import LINEAR_RANK_RULES
from .linear_residual_rules import LINEAR_RESIDUAL_RULES
from .conv_residual_rules import CONV_RESIDUAL_RULES
from .pool_rules import POOL_RULES
from .attention_rules import ATTENTION_RULES
from .norm_rules import NORM_RULES
from .layout_rules import LAYOUT_RULES
from .weight_only_rules import WEIGHT_ONLY_RULES
from .dynamic_quant_rules import DYNAMIC_QUANT_RULES
from .cache_rules import CACHE_RULES
from .rope_rules import ROPE_RULES

QUANT_RULES = [*QUANTIZED_ADD_RULES, *EMBEDDING_RULES]  # QuantFusionPass's
RULES = [*QUANT_RULES, *QUANTIZED_GEMM_RULES, *GEMM_CONV_RULES, *WEIGHT_ONLY_RULES, *DYNAMIC_QUANT_RULES, *LINEAR_RANK_RULES, *LINEAR_RESIDUAL_RULES, *CONV_RESIDUAL_RULES, *POOL_RULES, *ATTENTION_RULES, *NORM_RULES, *CACHE_RULES, *ROPE_RULES, *LAYOUT_RULES, *FLOAT_RULES]

__all__ = ["Constraint", "EdgePattern", "Match", "PatternError", "Rule", "edge_patterns", "trace_edge_pattern", "trace_edge_patterns", "FLOAT_RULES",
           "QUANT_RULES", "QUANTIZED_ADD_RULES", "EMBEDDING_RULES", "QuantRule", "GEMM_CONV_RULES", "QUANTIZED_GEMM_RULES", "LINEAR_RANK_RULES", "LINEAR_RESIDUAL_RULES", "CONV_RESIDUAL_RULES", "WEIGHT_ONLY_RULES", "DYNAMIC_QUANT_RULES", "CACHE_RULES", "ROPE_RULES", "POOL_RULES", "ATTENTION_RULES", "NORM_RULES", "LAYOUT_RULES", "RULES"]
