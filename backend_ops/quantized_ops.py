"""Quantized backend ops (`quantized_decomposed` namespace): dequantize -> op -> quantize in one.

Schemas are the ones executorch 1.5.1 defines itself (`exir/passes/_quant_patterns_and_replacements.py`,
imported with `executorch.exir`); the registry reuses them. What etfuse adds:

* a dtype-generic pattern (int8 and uint8; executorch's hard-codes uint8) bound as the
  CompositeImplicitAutograd kernel of add / add.scalar / add_relu, so retracing a fused program
  gives `dequantize_per_tensor -> add [-> relu] -> quantize_per_tensor` back;
* the etfuse twins a lowered program calls (`etfuse::quantized_decomposed_add.out`, ...;
  runtime_names.py), with reference and fake kernels; compiled kernels replace them.

These ops live in a namespace executorch owns, so importing this module declares the records and
registers nothing: `install()` (called through `etfuse.backend_ops.install()`) does it all, once.
etfuse defines no `.out` schema in that namespace: executorch's stock quantized library
(`import executorch.kernels.quantized`) defines several, and may be imported before or after.

Semantics, bit for bit (what the kernels implement): dequantize is `(float(q) - float(zp)) * float(scale)`,
quantize is `clamp(rint(x * float(1.0 / scale)) + float(zp), qmin, qmax)` in float32 (round half to even).

The embeddings (embedding_byte / _4bit / _2bit and their `.dtype` variants) are declared in
embedding_ops.py and listed in QUANTIZED_OPS with the others.
"""

from __future__ import annotations

import torch

from . import embedding_ops, registry
from .embedding_ops import EMBEDDING_BYTE, EMBEDDING_OPS  # noqa: F401 (EMBEDDING_BYTE is imported from here too)
from .registry import BackendOp, library, register
from .runtime_names import runtime_op

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _dq(q, scale, zero_point, quant_min, quant_max):
    return qd.dequantize_per_tensor.default(q, scale, zero_point, quant_min, quant_max, q.dtype)


def _add(a, a_scale, a_zero_point, a_quant_min, a_quant_max,
         b, b_scale, b_zero_point, b_quant_min, b_quant_max,
         out_scale, out_zero_point, out_quant_min, out_quant_max):
    s = aten.add.Tensor(_dq(a, a_scale, a_zero_point, a_quant_min, a_quant_max),
                        _dq(b, b_scale, b_zero_point, b_quant_min, b_quant_max))
    return qd.quantize_per_tensor.default(s, out_scale, out_zero_point, out_quant_min, out_quant_max, a.dtype)


def _add_relu(a, a_scale, a_zero_point, a_quant_min, a_quant_max,
              b, b_scale, b_zero_point, b_quant_min, b_quant_max,
              out_scale, out_zero_point, out_quant_min, out_quant_max):
    s = aten.add.Tensor(_dq(a, a_scale, a_zero_point, a_quant_min, a_quant_max),
                        _dq(b, b_scale, b_zero_point, b_quant_min, b_quant_max))
    return qd.quantize_per_tensor.default(aten.relu.default(s), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, a.dtype)


def _add_scalar(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype, b,
                out_scale, out_zero_point, out_quant_min, out_quant_max, out_dtype):
    x = qd.dequantize_per_tensor.default(qa, a_scale, a_zero_point, a_quant_min, a_quant_max, a_dtype)
    return qd.quantize_per_tensor.default(aten.add.Scalar(x, b), out_scale, out_zero_point, out_quant_min,
                                          out_quant_max, out_dtype)


def _register_with_pattern_kernel(op: BackendOp) -> None:
    """register(), making sure the CompositeImplicitAutograd kernel is etfuse's dtype-generic pattern.

    executorch binds its uint8-only patterns to add / add.scalar / add_relu the first time its
    QuantFusionPass runs; if that happened before `install()`, `register` keeps executorch's
    kernel (bind_pattern_to_op never replaces one), and retracing an int8 program would fail.
    Replace it then; in the other order executorch's binding leaves ours in place.
    """
    had_kernel = registry.has_kernel(op.qualname, "CompositeImplicitAutograd")
    register(op)
    if had_kernel:
        library(op.namespace).impl(op.name, op.pattern, "CompositeImplicitAutograd", allow_override=True)


_BINARY_ARGS = ("Tensor a, float a_scale, int a_zero_point, int a_quant_min, int a_quant_max, "
                "Tensor b, float b_scale, int b_zero_point, int b_quant_min, int b_quant_max, "
                "float out_scale, int out_zero_point, int out_quant_min, int out_quant_max")

QUANTIZED_ADD = BackendOp(
    "quantized_decomposed", f"add({_BINARY_ARGS}) -> Tensor qc", _add,
    doc="q(dq(a) + dq(b)), per-tensor qparams, int8 or uint8 (a, b and the result share the dtype), broadcasting",
    kernel="quantized_add", triton="quantized_add_op")
QUANTIZED_ADD_RELU = BackendOp(
    "quantized_decomposed", f"add_relu({_BINARY_ARGS}) -> Tensor qc", _add_relu,
    doc="q(relu(dq(a) + dq(b))), like add", kernel="quantized_add",
    triton="quantized_add_relu_op")
QUANTIZED_ADD_SCALAR = BackendOp(
    "quantized_decomposed",
    "add.scalar(Tensor qa, float a_scale, int a_zero_point, int a_quant_min, int a_quant_max, ScalarType a_dtype, "
    "Scalar b, float out_scale, int out_zero_point, int out_quant_min, int out_quant_max, ScalarType out_dtype) -> Tensor",
    _add_scalar, doc="q(dq(qa) + b), b a Python scalar (float32 arithmetic)", kernel="quantized_add")
QUANTIZED_OPS = [QUANTIZED_ADD, QUANTIZED_ADD_RELU, QUANTIZED_ADD_SCALAR, *EMBEDDING_OPS]


# The per-tensor quantize/dequantize that fused programs keep at their edges. torch.ao defines
# the functional ops; a lowered program calls their etfuse twins (runtime_names.py), so a fused
# int8 program runs on etfuse's kernels alone, with or without executorch's stock quantized ones.
def _quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype):
    return qd.quantize_per_tensor.default(input, scale, zero_point, quant_min, quant_max, dtype)


def _dequantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None):
    return qd.dequantize_per_tensor.default(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=out_dtype)


QUANTIZE_PER_TENSOR = BackendOp(
    "quantized_decomposed",
    "quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype) -> Tensor",
    _quantize_per_tensor, doc="torch.ao's op; etfuse adds the .out variant and kernels",
    kernel="quantize_per_tensor")
DEQUANTIZE_PER_TENSOR = BackendOp(
    "quantized_decomposed",
    "dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype, "
    "*, ScalarType? out_dtype=None) -> Tensor",
    _dequantize_per_tensor, doc="torch.ao's op; etfuse adds the .out variant and kernels",
    kernel="dequantize_per_tensor")

def _dequantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype=None):
    return qd.dequantize_per_channel.default(input, scales, zero_points, axis, quant_min, quant_max, dtype,
                                             out_dtype=out_dtype)


# What a PT2E conv/linear weight leaves where no quantized rule fused it (a float op reads it).
DEQUANTIZE_PER_CHANNEL = BackendOp(
    "quantized_decomposed",
    "dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, int quant_max, "
    "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    _dequantize_per_channel, doc="torch.ao's op; etfuse adds the .out variant and kernels",
    kernel="dequantize_per_channel")

QDQ_OPS = [QUANTIZE_PER_TENSOR, DEQUANTIZE_PER_TENSOR, DEQUANTIZE_PER_CHANNEL]


def decompositions() -> dict:
    """{functional op: pattern} for `ExportedProgram.run_decompositions`: gives every quantized
    backend op its pattern back, including the embeddings (whose functional ops have
    CompositeExplicitAutograd kernels, so a plain retrace keeps them)."""
    return {op.aten: op.pattern for op in QUANTIZED_OPS}


def install() -> None:
    """Register the quantized ops and make etfuse's kernels theirs (not idempotent on its own:
    `etfuse.backend_ops.install()` calls it once)."""
    for op in (QUANTIZED_ADD, QUANTIZED_ADD_RELU, QUANTIZED_ADD_SCALAR):
        _register_with_pattern_kernel(op)
    for op in QDQ_OPS:
        register(op)
    embedding_ops.install()
    for op in (*QUANTIZED_OPS, *QDQ_OPS):
        register(runtime_op(op))
