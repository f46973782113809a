"""Fusion rules as data: one module per family."""

from .rule import Constraint, LoweredPattern, Match, PatternError, Rule
from .float_rules import FLOAT_RULES
from .quant_rules import QUANT_RULES, QuantRule
from .gemm_conv_rules import GEMM_CONV_RULES

__all__ = ["Constraint", "LoweredPattern", "Match", "PatternError", "Rule", "FLOAT_RULES", "QUANT_RULES", "QuantRule", "GEMM_CONV_RULES"]
