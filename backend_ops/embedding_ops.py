"""Quantized embeddings: `quantized_decomposed::embedding_byte`, `embedding_4bit`, `embedding_2bit`
and their `.dtype` variants, and the weight packing `quant_fusion::_pack_embedding_weight`.

Schemas are executorch 1.5.1's (`exir/passes/_quant_patterns_and_replacements.py`, imported with
`executorch.exir`); the registry reuses them. Each op computes

    out[..., j] = to_out((float32(q[idx, j]) - float32(zp[idx, j // gs])) * float32(scale[idx, j // gs]))

each step a float32 operation, rounded once to the output dtype: the scales' dtype (float32,
float16 or bfloat16) for the functional op, `dtype` (None: the scales') for `.dtype`. Scales are
[N] / [N, 1] (per row) or [N, G] (groups of gs = D / G columns); zero points None or the scales'
shape, any int or float dtype. This is what `embedding(dequantize_affine(...))` and
`embedding(dequantize_per_channel_group(...))` compute for integer-valued zero points, which is
what the fusion rules (patterns/embedding_rules.py) check before they fuse.

q is stored as executorch stores it: byte: int8/uint8 [N, D]; 4 bits: uint8 [N, D / 2], element
2k in the high nibble of byte k, q = nibble - 8; 2 bits: uint8 [N, D / 4], element 4k + t in bits
2t..2t+1 of byte k, q = field - 2 (`_pack_embedding_weight`'s layout).

executorch registers CompositeExplicitAutograd and fake kernels for these functional ops that
insist on zero points of the scales' dtype and give float32 fakes for float16 scales; `install()`
replaces them with the patterns here (torch allows no CompositeImplicitAutograd kernel next to an
explicit one, so a plain retrace keeps the op; `decompositions()` in quantized_ops.py gives the
pattern), and the `.out` fake kernels with the derived ones (executorch's return a fresh tensor,
not `out`). Compiled kernels: kernels/csrc/ops/embedding.cpp (one core for the three widths,
core/embedding.h) and kernels/csrc/ops/pack_embedding_weight.cpp.

`etfuse::embedding_byte_int8_zp` is embedding_byte with int8 zero points subtracted from int8 values
in int8, wrapping, as `dequantize_per_channel_group` does (torch keeps int8 - int8 in int8: 127 -
-128 is -1); embedding_byte subtracts in float32, which differs wherever `q - zp` leaves int8. The
8-bit group rule writes it for int8 zero points whatever their values (a graph module alone, as
`ExecutorchBackendConfig(passes=...)` hands passes, does not show them). `etfuse::embedding_4bit_int8_zp`
and `embedding_2bit_int8_zp` do the same on embedding_4bit / embedding_2bit's packed tables: int8 zero
points are legal outside the nibble's range, where `q - zp` leaves int8 (7 - -128 is -121).

The packing op is executorch's own (`torch.ops.quant_fusion._pack_embedding_weight`: its test
file expects that name). `etfuse.fuse` and `transform(default_passes())` fold it into a program
constant after fusion (passes/pipeline.py); in the `ExecutorchBackendConfig(passes=...)` route
the weights are placeholders without values, so the pack op stays in the program and runs on
the runtime, once per call (its `.out` kernel below).
"""

from __future__ import annotations

import warnings

import torch

from .registry import BackendOp, library, out_fake_kernel, register

aten = torch.ops.aten

_ARGS = ("Tensor weight, Tensor weight_scales, Tensor? weight_zero_points, int weight_quant_min, "
         "int weight_quant_max, Tensor indices")


def _dequantize(q, weight_scales, weight_zero_points, dtype):
    """q: [N, D] values (any int or float dtype, exact in float32) -> [N, D] in `dtype`."""
    n, d = q.shape
    s = aten.reshape.default(weight_scales, [n, -1])
    g = s.shape[1]
    w = aten.reshape.default(aten._to_copy.default(q, dtype=torch.float32), [n, g, d // g])
    if weight_zero_points is not None:
        z = aten.reshape.default(weight_zero_points, [n, g, 1])
        w = aten.sub.Tensor(w, aten._to_copy.default(z, dtype=torch.float32))
    w = aten.mul.Tensor(w, aten._to_copy.default(aten.reshape.default(s, [n, g, 1]), dtype=torch.float32))
    return aten._to_copy.default(aten.reshape.default(w, [n, d]), dtype=dtype)


def _unpack(weight, bits: int):
    """The signed values of a packed uint8 table (float32, exact), in column order."""
    n = weight.shape[0]
    if bits == 4:
        fields = [aten.bitwise_right_shift.Tensor_Scalar(weight, 4), aten.bitwise_and.Scalar(weight, 15)]
    else:
        fields = [aten.bitwise_and.Scalar(aten.bitwise_right_shift.Tensor_Scalar(weight, 2 * t), 3) for t in range(4)]
    q = aten.reshape.default(aten.stack.default(fields, -1), [n, -1])
    return aten.sub.Tensor(aten._to_copy.default(q, dtype=torch.float32), 8.0 if bits == 4 else 2.0)


def _embedding(q, weight_scales, weight_zero_points, indices, dtype):
    dtype = weight_scales.dtype if dtype is None else dtype
    return aten.embedding.default(_dequantize(q, weight_scales, weight_zero_points, dtype), indices)


def _embedding_byte(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices):
    return _embedding(weight, weight_scales, weight_zero_points, indices, None)


def _embedding_byte_dtype(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices,
                          dtype=None):
    return _embedding(weight, weight_scales, weight_zero_points, indices, dtype)


def _embedding_4bit(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices):
    return _embedding(_unpack(weight, 4), weight_scales, weight_zero_points, indices, None)


def _embedding_4bit_dtype(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices,
                          dtype=None):
    return _embedding(_unpack(weight, 4), weight_scales, weight_zero_points, indices, dtype)


def _embedding_2bit(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices):
    return _embedding(_unpack(weight, 2), weight_scales, weight_zero_points, indices, None)


def _embedding_2bit_dtype(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices,
                          dtype=None):
    return _embedding(_unpack(weight, 2), weight_scales, weight_zero_points, indices, dtype)


def _record(name, pattern, what):
    dtype = name.endswith(".dtype")
    schema = f"{name}({_ARGS}{', *, ScalarType? dtype=None' if dtype else ''}) -> Tensor"
    out = "`dtype` (float32, float16, bfloat16; None: the scales')" if dtype else "the scales' dtype"
    doc = (f"embedding(dq(weight), indices): weight {what}, scales [N], [N, 1] or [N, G] (groupwise) "
           f"float32/float16/bfloat16, zero points None or the scales' shape; out {out}")
    return BackendOp("quantized_decomposed", schema, pattern, doc=doc, kernel="embedding", triton="embedding_byte" if name == "embedding_byte" else None)


_BYTE = "int8/uint8 [N, D]"
_4BIT = "uint8 [N, D/2], two int4 a byte (high nibble first, q = nibble - 8)"
_2BIT = "uint8 [N, D/4], four int2 a byte (low bits first, q = field - 2)"
EMBEDDING_BYTE = _record("embedding_byte", _embedding_byte, _BYTE)
EMBEDDING_BYTE_DTYPE = _record("embedding_byte.dtype", _embedding_byte_dtype, _BYTE)
EMBEDDING_4BIT = _record("embedding_4bit", _embedding_4bit, _4BIT)
EMBEDDING_4BIT_DTYPE = _record("embedding_4bit.dtype", _embedding_4bit_dtype, _4BIT)
EMBEDDING_2BIT = _record("embedding_2bit", _embedding_2bit, _2BIT)
EMBEDDING_2BIT_DTYPE = _record("embedding_2bit.dtype", _embedding_2bit_dtype, _2BIT)

_EXECUTORCH_OPS = [EMBEDDING_BYTE, EMBEDDING_BYTE_DTYPE, EMBEDDING_4BIT, EMBEDDING_4BIT_DTYPE, EMBEDDING_2BIT,
                   EMBEDDING_2BIT_DTYPE]


def _embedding_byte_int8_zp(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices,
                            dtype=None):
    q = weight
    if weight_zero_points is not None:
        n, d = weight.shape
        g = aten.reshape.default(weight_scales, [n, -1]).shape[1]
        # int8 - int8 stays int8 in torch and wraps (127 - -128 is -1), as dequantize_per_channel_group's
        # `w_int8.sub(zp)` does; the product and the rounding are embedding_byte's
        q = aten.reshape.default(aten.sub.Tensor(aten.reshape.default(weight, [n, g, d // g]),
                                                 aten.reshape.default(weight_zero_points, [n, g, 1])), [n, d])
    return _embedding(q, weight_scales, None, indices, dtype)


# What the 8-bit group rule (patterns/embedding_rules.py) writes for int8 values with int8 zero
# points, seen or not: the choice depends on dtypes only, so every route writes the same op. An
# etfuse op, registered on import like the others.
EMBEDDING_BYTE_INT8_ZP = register(BackendOp(
    "etfuse",
    "embedding_byte_int8_zp(Tensor weight, Tensor weight_scales, Tensor? weight_zero_points, int weight_quant_min, "
    "int weight_quant_max, Tensor indices, *, ScalarType? dtype=None) -> Tensor",
    _embedding_byte_int8_zp,
    doc="embedding(dequantize_per_channel_group(weight, scales, zero_points)): weight int8 [N, D], scales as "
        "embedding_byte's, zero points None or int8 of the scales' shape, subtracted in int8 (wrapping, as torch's "
        "int8 subtraction does), then embedding_byte's float32 product rounded once to `dtype` (None: the scales')",
    kernel="embedding"))



def _packed_int8_zp(bits: int):
    def pattern(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices, dtype=None):
        q = aten._to_copy.default(_unpack(weight, bits), dtype=torch.int8)  # exact: [-8, 7] / [-2, 1]
        return _embedding_byte_int8_zp(q, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max,
                                       indices, dtype)

    return pattern


def _packed_int8_zp_op(bits: int, what: str):
    name = f"embedding_{bits}bit_int8_zp"
    return register(BackendOp(
        "etfuse", f"{name}({_ARGS}, *, ScalarType? dtype=None) -> Tensor", _packed_int8_zp(bits),
        doc=f"embedding_byte_int8_zp on a packed table: weight {what}, zero points None or int8 of the scales' "
            "shape (any int8 values), q - zp taken to int8 (wrapping) as dequantize_per_channel_group does, "
            "out `dtype` (None: the scales')",
        kernel="embedding"))


# What the 4- and 2-bit group rules write for int8 zero points whose q - zp may leave int8 (values
# unseen, or seen outside [hi - 127, lo + 128]): embedding_byte_int8_zp's arithmetic on the packed
# table embedding_4bit / embedding_2bit read.
EMBEDDING_4BIT_INT8_ZP = _packed_int8_zp_op(4, _4BIT)
EMBEDDING_2BIT_INT8_ZP = _packed_int8_zp_op(2, _2BIT)

# every embedding op: FoldPackedWeightsPass drops their all-zero constant zero points
EMBEDDING_OPS = [*_EXECUTORCH_OPS, EMBEDDING_BYTE_INT8_ZP, EMBEDDING_4BIT_INT8_ZP, EMBEDDING_2BIT_INT8_ZP]


def _pack_embedding_weight(weight, bitwidth):
    # executorch's reference, bit for bit (values outside the range spill into the neighbours' bits
    # there too): 4 bits: (v + 8) with element 2k in the high nibble; 2 bits: (v + 2), element 4k + t
    # at bits 2t.
    if bitwidth == 8:
        return aten.clone.default(weight)
    n, d = weight.shape
    per_byte = 8 // bitwidth
    u = aten.view.dtype(aten.add.Tensor(weight, 8 if bitwidth == 4 else 2), torch.uint8)
    u = aten.view.default(u, [n, d // per_byte, per_byte])
    fields = [aten.select.int(u, 2, t) for t in range(per_byte)]
    if bitwidth == 4:
        return aten.bitwise_or.Tensor(aten.bitwise_left_shift.Tensor_Scalar(fields[0], 4), fields[1])
    out = fields[0]
    for t in range(1, 4):
        out = aten.bitwise_or.Tensor(out, aten.bitwise_left_shift.Tensor_Scalar(fields[t], 2 * t))
    return out


PACK_EMBEDDING_WEIGHT = BackendOp(
    "quant_fusion", "_pack_embedding_weight(Tensor weight, SymInt bitwidth) -> Tensor", _pack_embedding_weight,
    doc="executorch's packing of an int8 [N, D] table into embedding_4bit / embedding_2bit's uint8 layout "
        "(bitwidth 8: a copy); folded into a constant by etfuse.fuse / transform, run by the runtime otherwise",
    kernel="pack_embedding_weight")


def install() -> None:
    """Register the records and make etfuse's patterns and fake kernels executorch's ops' (called
    once, from `etfuse.backend_ops.install()`)."""
    lib = library("quantized_decomposed")
    for op in _EXECUTORCH_OPS:
        register(op)
        with warnings.catch_warnings():
            # torch.ao's embedding_byte kernel is replaced on purpose (etfuse's pattern is the
            # dtype-generic one); torch warns about any override
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel", category=UserWarning)
            lib.impl(op.name, op.pattern, "CompositeExplicitAutograd", allow_override=True)
        if torch._library.simple_registry.singleton.find(op.qualname).fake_impl.kernel is not None:
            torch.library.register_fake(op.qualname, op.pattern, lib=lib, allow_override=True)
        torch.library.register_fake(f"{op.namespace}::{op.out_name}", out_fake_kernel(op), lib=lib,
                                    allow_override=True)
    register(PACK_EMBEDDING_WEIGHT)
