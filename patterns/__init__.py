"""Fusion rules as data: one module per family."""

from .rule import Constraint, LoweredPattern, Match, PatternError, Rule
from .float_rules import FLOAT_RULES
from .quant_rules import QUANT_RULES, QuantRule

__all__ = ["Constraint", "LoweredPattern", "Match", "PatternError", "Rule", "FLOAT_RULES", "QUANT_RULES", "QuantRule"]
