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


def gemm_conv_passes() -> list:
    """The foundation's float fusions plus GEMM/conv, in the order they must run: batch norm is
    folded first (its ExportedProgram pass turns conv/linear -> bn into conv/linear), then the
    GEMM/conv rules, then the elementwise ones (residual relu(add) -> add_relu)."""
    from .batch_norm_folding import BatchNormFoldPass
    from .float_fusion import FloatFusionPass

    return [BatchNormFoldPass(), GemmConvFusionPass(), FloatFusionPass()]
