"""ExportPass subclasses that fuse and lower edge-dialect graphs, and the default pipeline."""

from .engine import Declined, Fused, FusionError, FusionReport, NearMiss, RuleIndex, apply_matches, find_matches
from .graph_copy import copy_graph_module, graph_modules
from .fusion_pass import FusionPass
from .float_fusion import FloatFusionPass
from .quant_fusion import QuantFusionPass
from .gemm_conv_fusion import GemmConvFusionPass, gemm_conv_passes
from .batch_norm_folding import BatchNormFoldPass
from .symint_to_prims import SymIntLoweringError, SymIntToPrimsPass, to_edge_with_prims
from .loop_lowering import (
    LoopLoweringError, LoopLoweringPass, MapToScanPass, SpecialisedShapeError, refuse_specialised,
    to_edge_control_flow,
)
from .cond_outputs import CondOutputCopyPass
from .cond_views import CondViewCopyPass
from .constant_folding import ConstantFoldingPass, fold_constants
from .fused_program import FusedEdgeProgramManager
from .verify import verify_written_nodes
from .pipeline import default_passes, fuse

__all__ = [
    "Declined", "Fused", "FusionError", "FusionReport", "NearMiss", "RuleIndex", "apply_matches", "find_matches",
    "FusionPass", "graph_modules", "FloatFusionPass", "QuantFusionPass", "GemmConvFusionPass", "gemm_conv_passes", "BatchNormFoldPass",
    "SymIntLoweringError", "SymIntToPrimsPass", "to_edge_with_prims",
    "LoopLoweringError", "LoopLoweringPass", "MapToScanPass", "SpecialisedShapeError", "refuse_specialised",
    "to_edge_control_flow", "CondOutputCopyPass", "CondViewCopyPass", "default_passes", "fuse",
    "copy_graph_module", "ConstantFoldingPass", "fold_constants", "FusedEdgeProgramManager", "verify_written_nodes",
]
