"""Host side of the Triton kernels: validation, broadcast strides, block sizes, grid, launch.

Each launcher takes torch tensors on one device and returns (or fills) the op's result:
`add_relu`, `linear_relu`, `addmm_relu`, `quantized_add` (add / add_relu) and
`embedding_byte`. On CUDA tensors they launch the compiled kernels; under Triton's
interpreter (`TRITON_INTERPRET=1` set before triton is imported) the same launchers run the
kernels on CPU tensors, which is how CI checks them.

A case a kernel does not cover (a dtype it was not written for, mixed dtypes, more than four
dims left after collapsing broadcast dims) raises `Unsupported`; the CUDA registrations
(`registration.py`) then run the op's pattern with torch's own CUDA ops. Invalid arguments
(qparams, shapes) raise the same RuntimeError text as the C++ kernels.
"""

from __future__ import annotations

import math
import struct
from typing import Optional, Sequence

import torch

import triton

from . import _jit


class Unsupported(ValueError):
    """This call is outside what the Triton kernel covers; use the op's pattern instead."""


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUANT_DTYPES = (torch.int8, torch.uint8)

# Element-wise kernels: 4 KiB of each operand per program over 4 warps, i.e. two 16-byte
# vector accesses per thread and operand whatever the element size (1024 float32, 2048
# float16, 4096 int8 elements; inductor's 1-D memory-bound kernels use 1024 float32 / 4
# warps). Tests pass a smaller `block` to exercise masking.
ELEMENTWISE_BYTES = 4096
ELEMENTWISE_WARPS = 4


def elementwise_block(dtype: torch.dtype) -> int:
    return ELEMENTWISE_BYTES // dtype.itemsize


def _broadcast_shape(a: torch.Tensor, b: torch.Tensor):
    # torch.broadcast_shapes costs tens of microseconds per call; same shapes need none of it
    return a.shape if a.shape == b.shape else torch.broadcast_shapes(a.shape, b.shape)
MAX_DIMS = 4


# ---- broadcasting ----------------------------------------------------------------------

def broadcast_plan(shape: Sequence[int], operands: Sequence[torch.Tensor]):
    """Collapse the iteration space of a contiguous output of `shape` read from `operands`.

    Returns (sizes, strides_per_operand, contig): sizes [s0, s1, s2, s3] (innermost last) and
    each operand's element strides along them (0 where broadcast), like the C++ cores' plan
    (size-1 dims dropped, adjacent dims merged where every operand allows). contig: one run
    with unit strides everywhere. Raises Unsupported past MAX_DIMS dims.
    """
    ndim = len(shape)
    dims = []  # innermost first: [size, out_stride, stride per operand...]
    out_stride = 1
    for d in range(ndim - 1, -1, -1):
        size = int(shape[d])
        strides = []
        for t in operands:
            dt = t.dim() - ndim + d
            strides.append(0 if dt < 0 or t.shape[dt] == 1 else int(t.stride(dt)))
        if size != 1:
            if dims:
                prev = dims[-1]
                if prev[1] * prev[0] == out_stride and all(
                        s == ps * prev[0] for s, ps in zip(strides, prev[2:])):
                    prev[0] *= size
                    out_stride *= size
                    continue
            dims.append([size, out_stride] + strides)
        out_stride *= size
    if len(dims) > MAX_DIMS:
        raise Unsupported(f"{len(dims)} dims after collapsing broadcast dims; the kernels take {MAX_DIMS}")
    contig = len(dims) <= 1 and all(s == 1 for s in (dims[0][2:] if dims else []))
    while len(dims) < MAX_DIMS:
        dims.append([1, 0] + [0] * len(operands))
    dims.reverse()  # outermost first
    sizes = [d[0] for d in dims]
    strides = [[d[2 + k] for d in dims] for k in range(len(operands))]
    return sizes, strides, contig


def _overlaps(out: torch.Tensor, *inputs: Optional[torch.Tensor]) -> bool:
    """Conservative: out shares storage with an input."""
    if out.numel() == 0:
        return False
    ptr = out.untyped_storage().data_ptr()
    return any(t is not None and t.numel() > 0 and t.untyped_storage().data_ptr() == ptr for t in inputs)


def _into(out: Optional[torch.Tensor], shape, dtype, device, inputs, fill):
    """Run `fill(dst)` on a contiguous destination of `shape` and return the result: `out`
    itself when it can take it directly (resized like an out variant), else a fresh tensor
    copied into `out` afterwards."""
    if out is None:
        dst = torch.empty(shape, dtype=dtype, device=device)
        fill(dst)
        return dst
    if out.dtype != dtype:
        raise RuntimeError(f"out has dtype {out.dtype}, the op produces {dtype}")
    if tuple(out.shape) != tuple(shape):
        out.resize_(shape)
    if out.is_contiguous() and not _overlaps(out, *inputs):
        fill(out)
        return out
    dst = torch.empty(shape, dtype=dtype, device=device)
    fill(dst)
    return out.copy_(dst)


def _same_device(op: str, *tensors: Optional[torch.Tensor]) -> torch.device:
    devs = {t.device for t in tensors if t is not None}
    if len(devs) != 1:
        raise RuntimeError(f"{op}: all tensors must be on one device, got {sorted(map(str, devs))}")
    return devs.pop()


# ---- add_relu --------------------------------------------------------------------------

def add_relu(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None,
             block: Optional[int] = None) -> torch.Tensor:
    """relu(a + b) with broadcasting; a and b float32, float16 or bfloat16, one dtype."""
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"etfuse::add_relu kernel takes two {', '.join(map(str, FLOAT_DTYPES))} tensors of one "
                          f"dtype, got {a.dtype} and {b.dtype}")
    device = _same_device("etfuse::add_relu", a, b)
    shape = _broadcast_shape(a, b)
    sizes, (sa, sb), contig = broadcast_plan(shape, (a, b))
    n = math.prod(shape)
    block = block or elementwise_block(a.dtype)

    def fill(dst):
        if n == 0:
            return
        _jit.add_relu_kernel[(triton.cdiv(n, block),)](
            a, b, dst, n, sizes[1], sizes[2], sizes[3], *sa, *sb,
            CONTIG=contig, BLOCK=block, num_warps=ELEMENTWISE_WARPS)

    return _into(out, shape, a.dtype, device, (a, b), fill)


# ---- quantized add / add_relu ----------------------------------------------------------

_QRANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
_F32_MAX = 3.4028234663852886e38


def _f32(v: float) -> float:
    """float(v) rounded to float32 (nearest even), as static_cast<float> does in the C++ kernels."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _qparams(op: str, what: str, scale: float, zp: int, qmin: int, qmax: int, dtype: torch.dtype):
    """The C++ kernels' make_qparams: the same checks and messages, and the float32 values the
    arithmetic uses (inv_scale = float(1.0 / scale) computed in double)."""
    lo, hi = _QRANGE[dtype]
    name = "int8" if dtype == torch.int8 else "uint8"
    if not (scale > 0.0) or not math.isfinite(scale):
        raise RuntimeError(f"{op}: {what}_scale must be finite and > 0, got {scale:g}")
    if qmin > qmax or qmin < lo or qmax > hi:
        raise RuntimeError(f"{op}: {what} quant range [{qmin}, {qmax}] is not inside {name}'s [{lo}, {hi}]")
    if zp < qmin or zp > qmax:
        raise RuntimeError(f"{op}: {what}_zero_point {zp} is outside the quant range [{qmin}, {qmax}]")
    # Checked in float32, the precision the kernel computes in (see make_qparams in quantized.h).
    fscale, finv = _f32(scale), _f32(1.0 / scale)
    if not (fscale > 0.0) or not math.isfinite(fscale):
        raise RuntimeError(f"{op}: {what}_scale {scale:g} is not a finite float32 > 0 (the kernel computes in float32)")
    if not math.isfinite(finv):
        raise RuntimeError(f"{op}: {what}_scale {scale:g} is too small: 1/scale = {1.0 / scale:g} overflows float32 "
                           f"(the kernel computes in float32; scale must be >= {1.0 / _F32_MAX:g})")
    if not math.isfinite(_f32(fscale * float(hi - lo))):
        raise RuntimeError(f"{op}: {what}_scale {scale:g} is too large: (q - zero_point) * scale overflows float32")
    return fscale, finv, _f32(zp), _f32(qmin), _f32(qmax)


def quantized_add(a, a_scale, a_zero_point, a_quant_min, a_quant_max,
                  b, b_scale, b_zero_point, b_quant_min, b_quant_max,
                  out_scale, out_zero_point, out_quant_min, out_quant_max,
                  relu: bool = False, out: Optional[torch.Tensor] = None, block: Optional[int] = None):
    """quantized_decomposed::add (relu=False) / add_relu: int8 or uint8 (a, b and the result
    share the dtype), per-tensor qparams, broadcasting. Bit-exact with the C++ kernels."""
    op = f"quantized_decomposed::{'add_relu' if relu else 'add'}"
    if a.dtype not in QUANT_DTYPES:
        raise RuntimeError(f"{op}: a must be int8 or uint8, got {a.dtype}")
    if b.dtype != a.dtype or (out is not None and out.dtype != a.dtype):
        raise RuntimeError(f"{op}: a, b and out must share one dtype, got {a.dtype}, {b.dtype}, "
                           f"{out.dtype if out is not None else a.dtype}")
    sa_, _, za, _, _ = _qparams(op, "a", a_scale, a_zero_point, a_quant_min, a_quant_max, a.dtype)
    sb_, _, zb, _, _ = _qparams(op, "b", b_scale, b_zero_point, b_quant_min, b_quant_max, a.dtype)
    _, inv, zo, lo, hi = _qparams(op, "out", out_scale, out_zero_point, out_quant_min, out_quant_max, a.dtype)
    device = _same_device(op, a, b)
    try:
        shape = _broadcast_shape(a, b)
    except RuntimeError as e:
        raise RuntimeError(f"{op}: shapes {list(a.shape)} and {list(b.shape)} cannot be broadcast together") from e
    sizes, (sa, sb), contig = broadcast_plan(shape, (a, b))
    n = math.prod(shape)
    block = block or elementwise_block(a.dtype)

    def fill(dst):
        if n == 0:
            return
        _jit.quantized_add_kernel[(triton.cdiv(n, block),)](
            a, b, dst, n, sizes[1], sizes[2], sizes[3], *sa, *sb,
            sa_, za, sb_, zb, inv, zo, lo, hi,
            RELU=relu, CONTIG=contig, BLOCK=block, num_warps=ELEMENTWISE_WARPS, enable_fp_fusion=False)

    return _into(out, shape, a.dtype, device, (a, b), fill)



def quantized_add_op(*args, out: Optional[torch.Tensor] = None):
    """quantized_decomposed::add with the op's schema arguments (the catalog's launcher)."""
    return quantized_add(*args, relu=False, out=out)


def quantized_add_relu_op(*args, out: Optional[torch.Tensor] = None):
    """quantized_decomposed::add_relu with the op's schema arguments (the catalog's launcher)."""
    return quantized_add(*args, relu=True, out=out)

# ---- linear_relu / addmm_relu ----------------------------------------------------------

def matmul_config(M: int, N: int, K: int, dtype: torch.dtype) -> dict:
    """Tile sizes: 128x256x64 / 8 warps / 3 stages (the best sm_90 float16 tile of Triton's
    matmul tutorial) for large problems; smaller tiles where there are too few tiles to fill
    the GPU. float32 uses half the K tile (twice the bytes per element)."""
    bk = 64 if dtype != torch.float32 else 32
    if M >= 1024 and N >= 1024:
        return dict(BLOCK_M=128, BLOCK_N=256 if dtype != torch.float32 else 128, BLOCK_K=bk, GROUP_M=8,
                    num_warps=8, num_stages=3)
    if M >= 256 and N >= 256:
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)


def _input_precision(dtype: torch.dtype) -> str:
    # torch's float32 matmul on CUDA uses TF32 only when the user allowed it.
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _mm_relu(op: str, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], out_shape,
             out: Optional[torch.Tensor], config: Optional[dict]) -> torch.Tensor:
    """relu(a[M, K] @ b[K, N] + bias) into a tensor of out_shape (numel M * N); bias already
    expanded to [M, N] (stride-0 views) or None."""
    M, K = a.shape
    N = b.shape[1]
    dtype = a.dtype
    device = _same_device(op, a, b, bias)
    cfg = dict(config or matmul_config(M, N, K, dtype))
    meta = {k: cfg.pop(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}

    def fill(dst):
        if M == 0 or N == 0:
            return
        c = dst.view(M, N)
        if K == 0:
            c.copy_(torch.relu(bias) if bias is not None else torch.zeros_like(c))
            return
        grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        _jit.addmm_relu_kernel[grid](
            a, b, bias if bias is not None else a, c, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            bias.stride(0) if bias is not None else 0, bias.stride(1) if bias is not None else 0,
            c.stride(0), c.stride(1),
            HAS_BIAS=bias is not None, EVEN_K=K % meta["BLOCK_K"] == 0,
            INPUT_PRECISION=_input_precision(dtype), **meta, **cfg)

    return _into(out, out_shape, dtype, device, (a, b, bias), fill)


def _check_float(op: str, *tensors: Optional[torch.Tensor]) -> None:
    dtypes = {t.dtype for t in tensors if t is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in FLOAT_DTYPES:
        raise Unsupported(f"{op} kernel takes tensors of one dtype out of {FLOAT_DTYPES}, got {sorted(map(str, dtypes))}")


def linear_relu(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                out: Optional[torch.Tensor] = None, config: Optional[dict] = None) -> torch.Tensor:
    """relu(input @ weight.T + bias); input [..., K], weight [N, K] read as stored, bias [N]."""
    op = "etfuse::linear_relu"
    _check_float(op, input, weight, bias)
    if weight.dim() != 2 or input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"{op}: input {list(input.shape)} and weight {list(weight.shape)} do not match "
                           "(weight must be [N, K], input [..., K])")
    N, K = weight.shape
    a = input.reshape(-1, K)
    b = weight.t()
    bias2 = None
    if bias is not None:
        if bias.dim() > 1 or bias.numel() not in (1, N):
            raise Unsupported(f"{op}: bias of shape {list(bias.shape)}")
        bias2 = bias.reshape(-1).expand(N).unsqueeze(0).expand(a.shape[0], N)
    return _mm_relu(op, a, b, bias2, (*input.shape[:-1], N), out, config)


def addmm_relu(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor,
               out: Optional[torch.Tensor] = None, config: Optional[dict] = None) -> torch.Tensor:
    """relu(self + mat1 @ mat2); mat1 [M, K], mat2 [K, N], self broadcast to [M, N]."""
    op = "etfuse::addmm_relu"
    _check_float(op, self, mat1, mat2)
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"{op}: mat1 {list(mat1.shape)} and mat2 {list(mat2.shape)} cannot be multiplied")
    M, N = mat1.shape[0], mat2.shape[1]
    try:
        bias = self.expand(M, N)
    except RuntimeError as e:
        raise RuntimeError(f"{op}: self {list(self.shape)} does not broadcast to [{M}, {N}]") from e
    return _mm_relu(op, mat1, mat2, bias, (M, N), out, config)


# ---- embedding_byte --------------------------------------------------------------------

def embedding_byte(weight, weight_scales, weight_zero_points, weight_quant_min, weight_quant_max, indices,
                   out: Optional[torch.Tensor] = None, block_rows: Optional[int] = None,
                   block_d: Optional[int] = None) -> torch.Tensor:
    """quantized_decomposed::embedding_byte: weight int8/uint8 [N, D], scales float32/float16
    [N] or [N, 1] (the output dtype), zero points None or per row, indices int32/int64.
    Groupwise ([N, G]) or bfloat16 scales are `Unsupported` (the registration runs the pattern)."""
    op = "quantized_decomposed::embedding_byte.out"
    if weight.dtype not in QUANT_DTYPES:
        raise RuntimeError(f"{op}: weight must be int8 or uint8, got {weight.dtype}")
    if weight.dim() != 2:
        raise RuntimeError(f"{op}: weight must be [N, D], got rank {weight.dim()}")
    lo, hi = _QRANGE[weight.dtype]
    if not (weight_quant_min <= weight_quant_max and weight_quant_min >= lo and weight_quant_max <= hi):
        raise RuntimeError(f"{op}: quant range [{weight_quant_min}, {weight_quant_max}] is not inside the weight dtype's")
    rows, D = weight.shape
    scales = weight_scales
    if scales.dtype == torch.bfloat16 or (scales.dim() == 2 and scales.shape[0] == rows and scales.shape[1] > 1):
        raise Unsupported("bfloat16 or groupwise scales: the op's pattern serves them")
    if scales.dtype not in (torch.float32, torch.float16):
        raise RuntimeError(f"{op}: weight_scales must be float32 or float16, got {scales.dtype}")
    if not (scales.numel() == rows and (scales.dim() == 1 or (scales.dim() == 2 and scales.shape[1] == 1))):
        raise RuntimeError(f"{op}: weight_scales must be [N] or [N, 1] (per row), got {list(scales.shape)}")
    zps = weight_zero_points
    if zps is not None and not (zps.numel() == rows and (zps.dim() == 1 or (zps.dim() == 2 and zps.shape[1] == 1))):
        raise RuntimeError(f"{op}: weight_zero_points must be [N] or [N, 1], got {list(zps.shape)}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"{op}: indices must be int64 or int32, got {indices.dtype}")
    device = _same_device(op, weight, scales, zps, indices)
    idx = indices.reshape(-1)
    if not idx.is_contiguous():
        idx = idx.contiguous()
    n_idx = idx.numel()
    if device.type != "cuda" and n_idx:  # free here; on a GPU it would cost a sync
        bad = idx[(idx < 0) | (idx >= rows)]
        if bad.numel():
            raise RuntimeError(f"{op}: index {int(bad[0])} is out of range for {rows} rows")
    # per-row vectors in their own dtype (converted in the kernel: no extra kernels here)
    s1 = scales.reshape(-1).contiguous()
    z1 = None
    if zps is not None:
        z1 = zps.reshape(-1).contiguous()
        if z1.dtype == torch.bool or z1.is_complex():
            z1 = z1.to(torch.float32)
    bd = block_d or min(triton.next_power_of_2(max(D, 1)), 256)
    br = block_rows or max(1, 4096 // bd)

    def fill(dst):
        if n_idx == 0 or D == 0:
            return
        grid = (triton.cdiv(n_idx, br), triton.cdiv(D, bd))
        _jit.embedding_byte_kernel[grid](
            weight, s1, z1 if z1 is not None else s1, idx, dst, n_idx, rows, D,
            weight.stride(0), weight.stride(1),
            HAS_ZP=z1 is not None, BLOCK_R=br, BLOCK_D=bd, num_warps=4, enable_fp_fusion=False)

    return _into(out, (*indices.shape, D), scales.dtype, device, (weight, scales, zps, indices), fill)
