"""FloatFusionPass: relu(add) -> add_relu, relu(linear) -> linear_relu, relu(addmm) -> addmm_relu."""

from etfuse.patterns.float_rules import FLOAT_RULES

from .fusion_pass import FusionPass


class FloatFusionPass(FusionPass):
    """Fuses a relu into the add / linear / addmm that feeds it (rules in patterns/float_rules.py)."""

    def __init__(self):
        super().__init__(FLOAT_RULES)
