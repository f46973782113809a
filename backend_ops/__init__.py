"""The etfuse op catalog: one `BackendOp` record per backend op (see registry.py)."""

from .registry import BackendOp, BackendOpError, register, registered_ops
from .float_ops import ADD_RELU, ADDMM_RELU, FLOAT_OPS, LINEAR_RELU
from .prims import PRIMS, PrimOp
from .quantized_ops import QDQ_OPS, QUANTIZED_OPS, decompositions

__all__ = [
    "BackendOp", "BackendOpError", "register", "registered_ops",
    "ADD_RELU", "LINEAR_RELU", "ADDMM_RELU", "FLOAT_OPS", "PRIMS", "PrimOp",
    "QUANTIZED_OPS", "QDQ_OPS", "decompositions",
]
