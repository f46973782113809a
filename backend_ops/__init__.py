"""The etfuse op catalog: one `BackendOp` record per backend op (see registry.py).

Importing it registers etfuse's own ops only; `install()` (executorch_overrides.py) makes the
changes to executorch's registrations that fusing and running need.
"""

from .registry import SHARED_NAMESPACES, BackendOp, BackendOpError, register, registered_ops
from .runtime_names import runtime_op
from .float_ops import ADD, ADD_RELU, ADDMM_RELU, FLOAT_OPS, LINEAR_RELU, MUL
from .prims import PRIMS, PrimOp
from .gemm_conv_ops import CONV2D_ACT, CONV2D_BN_ACT, GEMM_CONV_OPS, LINEAR_ACT, LINEAR_BN_ACT
from .quantized_ops import QDQ_OPS, QUANTIZED_OPS, decompositions
from .embedding_ops import (EMBEDDING_2BIT_INT8_ZP, EMBEDDING_4BIT_INT8_ZP, EMBEDDING_BYTE_INT8_ZP, EMBEDDING_OPS,
                            PACK_EMBEDDING_WEIGHT)
from .pool_ops import AVG_POOL2D, MAX_POOL2D, MEAN_HW, POOL_OPS
from .attention_ops import ATTENTION_OPS, SDPA
from .norm_ops import LAYER_NORM, NORM_OPS, RMS_NORM
from .layout_ops import LAYOUT_OPS, PERMUTE_COPY
from .weight_only_ops import LINEAR_QW, PACK_INT4, WEIGHT_ONLY_OPS
from .dynamic_quant_ops import DYNAMIC_QUANT_OPS, WEIGHT_ROW_SUMS, LINEAR_DQ
from .cache_ops import CACHE_OPS, UPDATE_CACHE
from .rope_ops import ROPE, ROPE_OPS
from .prepacked_ops import CONV2D_BN_PACKED_ACT, CONV2D_PACKED_ACT, LINEAR_PACKED_ACT, PACK_GEMM_WEIGHT, PREPACKED_OPS
from .quantized_gemm_ops import (QUANTIZED_CONV2D, QUANTIZED_CONV2D_PACKED, QUANTIZED_GEMM_OPS, QUANTIZED_LINEAR,
                                 QUANTIZED_LINEAR_PACKED)
from .executorch_overrides import install, installed

# Every record, whether registered yet or not (the quantized ones register in `install()`): what
# etfuse.kernels derives its op lists and build sources from.
CATALOG = [*FLOAT_OPS, *GEMM_CONV_OPS, *POOL_OPS, *ATTENTION_OPS, *NORM_OPS, *LAYOUT_OPS, *WEIGHT_ONLY_OPS, *DYNAMIC_QUANT_OPS, *CACHE_OPS, *ROPE_OPS, *PREPACKED_OPS, *QUANTIZED_GEMM_OPS, *QUANTIZED_OPS, PACK_EMBEDDING_WEIGHT, *QDQ_OPS]
# The etfuse twins a .pte calls for the kernel-backed ops of namespaces executorch shares
# (runtime_names.py), derived from the records above.
RUNTIME_TWINS = [runtime_op(op) for op in CATALOG if runtime_op(op) is not op]
CATALOG += RUNTIME_TWINS

__all__ = [
    "BackendOp", "BackendOpError", "register", "registered_ops", "SHARED_NAMESPACES", "runtime_op", "RUNTIME_TWINS",
    "ADD_RELU", "LINEAR_RELU", "ADDMM_RELU", "MUL", "ADD", "FLOAT_OPS", "PRIMS", "PrimOp", "CONV2D_ACT", "LINEAR_ACT", "CONV2D_BN_ACT", "LINEAR_BN_ACT", "GEMM_CONV_OPS",
    "MAX_POOL2D", "AVG_POOL2D", "MEAN_HW", "POOL_OPS", "SDPA", "ATTENTION_OPS", "RMS_NORM", "LAYER_NORM", "NORM_OPS", "PERMUTE_COPY", "LAYOUT_OPS", "LINEAR_QW", "PACK_INT4", "WEIGHT_ONLY_OPS", "LINEAR_DQ", "WEIGHT_ROW_SUMS", "DYNAMIC_QUANT_OPS", "UPDATE_CACHE", "CACHE_OPS", "ROPE", "ROPE_OPS",
    "LINEAR_PACKED_ACT", "CONV2D_PACKED_ACT", "CONV2D_BN_PACKED_ACT", "PACK_GEMM_WEIGHT", "PREPACKED_OPS",
    "QUANTIZED_CONV2D", "QUANTIZED_LINEAR", "QUANTIZED_CONV2D_PACKED", "QUANTIZED_LINEAR_PACKED", "QUANTIZED_GEMM_OPS",
    "QUANTIZED_OPS", "EMBEDDING_OPS", "PACK_EMBEDDING_WEIGHT", "EMBEDDING_BYTE_INT8_ZP", "EMBEDDING_4BIT_INT8_ZP", "EMBEDDING_2BIT_INT8_ZP", "QDQ_OPS", "decompositions", "install", "installed", "CATALOG",
]
