"""ExportPass subclasses that fuse edge-dialect graphs, and the default pipeline."""

from .engine import Declined, Fused, FusionError, FusionReport, RuleIndex, apply_matches, find_matches
from .fusion_pass import FusionPass, graph_modules
from .float_fusion import FloatFusionPass
from .pipeline import default_passes, fuse

__all__ = [
    "Declined", "Fused", "FusionError", "FusionReport", "RuleIndex", "apply_matches", "find_matches",
    "FusionPass", "graph_modules", "FloatFusionPass", "default_passes", "fuse",
]
