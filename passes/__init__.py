"""ExportPass subclasses that fuse edge-dialect graphs, the default pipeline, and (in compat/)
the workarounds for executorch 1.5.1 behaviour that the pipeline needs."""

from .engine import Declined, Fused, FusionError, FusionReport, NearMiss, RuleIndex, apply_matches, find_matches
from .graph_copy import copy_graph_module, graph_modules
from .fusion_pass import BesideXnnpackFusionPass, FloatFusionPass, FusionPass, GemmConvFusionPass
from .quant_fusion import QuantFusionPass
from .compat.symint_to_prims import SymIntLoweringError, SymIntToPrimsPass
from .compat.while_loop_to_scan import LoopLoweringError, LoopLoweringPass
from .compat.map_to_scan import MapToScanPass, SpecialisedShapeError, refuse_specialised
from .compat.cond_outputs import CondOutputCopyPass
from .compat.cond_views import CondViewCopyPass
from .fold_packed_weights import FoldPackedWeightsPass
from .gated_linears import GatedLinearsPass
from .prepack_weights import PrepackWeightsPass
from .drop_identity_copies import DropIdentityCopiesPass
from .common_subexpressions import CommonSubexpressionPass
from .unit_dim_views import UnitDimViewsPass
from .runtime_names import EmitRuntimeNamesPass
from .fused_program import FusedEdgeProgramManager
from .verify import verify_written_nodes
from .replace_pattern import replace_pattern, replace_patterns
from .pipeline import correctness_passes, default_passes, fuse, passes_beside_xnnpack, to_edge

__all__ = [
    "Declined", "Fused", "FusionError", "FusionReport", "NearMiss", "RuleIndex", "apply_matches", "find_matches",
    "FusionPass", "BesideXnnpackFusionPass", "passes_beside_xnnpack", "graph_modules", "FloatFusionPass", "QuantFusionPass", "GemmConvFusionPass",
    "SymIntLoweringError", "SymIntToPrimsPass", "LoopLoweringError", "LoopLoweringPass", "MapToScanPass",
    "SpecialisedShapeError", "refuse_specialised", "CondOutputCopyPass", "CondViewCopyPass", "default_passes",
    "correctness_passes", "fuse", "to_edge", "copy_graph_module",
    "FoldPackedWeightsPass", "GatedLinearsPass", "PrepackWeightsPass", "DropIdentityCopiesPass", "CommonSubexpressionPass", "UnitDimViewsPass", "EmitRuntimeNamesPass", "FusedEdgeProgramManager", "verify_written_nodes", "replace_pattern", "replace_patterns",
]
