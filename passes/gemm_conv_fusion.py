"""GemmConvFusionPass: convolution / linear (+ relu, relu6/hardtanh, clamp) -> conv2d_act / linear_act.

Rules in patterns/gemm_conv_rules.py. Run `BatchNormFoldPass` (passes/batch_norm_folding.py)
first so that conv -> batch norm and linear -> batch norm reach these rules as a plain conv /
linear with folded constants.
"""

from etfuse.patterns.gemm_conv_rules import GEMM_CONV_RULES

from .fusion_pass import FusionPass


class GemmConvFusionPass(FusionPass):
    """Fuses bias, activation and weight transpose into one GEMM / conv2d backend op."""

    def __init__(self):
        super().__init__(GEMM_CONV_RULES)
