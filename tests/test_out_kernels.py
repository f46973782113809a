"""kernels/csrc/ops: every op's C++ `.out` kernel against its pattern, in torch eager
(libetfuse_eager.so) and on the ExecuTorch runtime (libetfuse_runtime.so), through the shared
checks of kernel_checks.py (the `kernel_check` fixture).

Each kernel-backed record of the catalog (for the ops of namespaces executorch shares, the etfuse
twin a `.pte` calls) has samples here: in eager, each tensor input contiguous, transposed,
sliced (`x[..., ::2]`) and channels-last (4-D), an out with transposed strides, and out being
each input of the output's shape (aliasing); on the runtime, one program with the contiguous and
channels-last samples. The element-wise binary ops (float add / mul / add_relu, the quantized add
and add_relu twins) are also checked on every broadcast (each operand order, size-1 dims, rank
mismatch, 0-d, empty) and on inputs that are views of one storage (`x` and `x[:1]`). The
per-op modules test each kernel's paths and errors in depth.
"""

from __future__ import annotations

import pytest
import torch

import etfuse.backend_ops as bo
from etfuse.backend_ops import runtime_op

pytestmark = pytest.mark.usefixtures("eager_kernels")

I8, U8, F16, BF16 = torch.int8, torch.uint8, torch.float16, torch.bfloat16
GEMM_TOL = dict(rtol=1e-4, atol=1e-4)


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=_g(seed))


def _q(shape, dtype=I8, seed=0, lo=None, hi=None):
    lo = (-128 if dtype == I8 else 0) if lo is None else lo
    hi = (127 if dtype == I8 else 255) if hi is None else hi
    return torch.randint(lo, hi + 1, shape, dtype=dtype, generator=_g(seed))


def _bn(c, seed=0):
    g = _g(seed)
    return (torch.randn(c, generator=g), torch.randn(c, generator=g), torch.randn(c, generator=g),
            torch.rand(c, generator=g) + 0.5, 1e-3)


def _packed(w):
    return bo.PACK_GEMM_WEIGHT.pattern(w.reshape(w.shape[0], -1))


def _conv_q(dtype=I8, seed=0, zero_points=True):
    """quantized_conv2d's arguments: [1, 6, 7, 7] input, 8 output channels, 3x3, padding 1."""
    g = _g(seed)
    lo, hi = (-128, 127) if dtype == I8 else (0, 255)
    x = _q((1, 6, 7, 7), dtype, seed)
    w = torch.randint(-127, 128, (8, 6, 3, 3), dtype=I8, generator=g)
    ws, b = torch.rand(8, generator=g) * 0.01 + 1e-4, torch.randn(8, generator=g)
    zp = torch.randint(-4, 5, (8,), generator=g) if zero_points else None
    return x, w, ws, zp, b, (0.0213, lo + 7, 0.0731, lo + 11, lo + 2, hi - 3)


def _samples():
    """{record: [(label, args, kwargs, options)]}: options are kernel_checks.layouts' (`fixed`: the
    inputs kept contiguous, `tol`)."""
    s: dict = {}

    def add(op, label, args, kwargs=None, **options):
        s.setdefault(runtime_op(op), []).append((label, tuple(args), kwargs or {}, options))

    x4, scale = _randn(2, 8, 5, 7), _randn(2, 8, 1, 1, seed=1)
    for op in (bo.ADD_RELU, bo.MUL, bo.ADD):
        add(op, "per channel", (x4, scale))
        add(op, "rows", (_randn(3, 5, 6), _randn(6, seed=2)))
        add(op, "same shape", (x4, _randn(2, 8, 5, 7, seed=3)))

    x, w, b = _randn(5, 13), _randn(9, 13, seed=1), _randn(9, seed=2)
    add(bo.LINEAR_RELU, "bias", (x, w, b), tol=GEMM_TOL)
    add(bo.LINEAR_RELU, "no bias, 3-D input", (_randn(2, 3, 13), w, None), tol=GEMM_TOL)
    add(bo.ADDMM_RELU, "row bias", (b, x, _randn(13, 9, seed=3)), tol=GEMM_TOL)
    add(bo.ADDMM_RELU, "full bias", (_randn(5, 9, seed=4), x, _randn(13, 9, seed=3)), tol=GEMM_TOL)

    cx, cw, cb = _randn(2, 6, 9, 9), _randn(12, 6, 3, 3, seed=1), _randn(12, seed=2)
    res = _randn(2, 12, 9, 9, seed=3)
    geometry = ([1, 1], [1, 1], [1, 1])
    # (the weight's layouts: test_conv_kernels_read_strided_weights)
    conv = dict(tol=GEMM_TOL, fixed=(1,))
    add(bo.CONV2D_ACT, "relu", (cx, cw, cb, *geometry, 1, 0.0, None), **conv)
    add(bo.CONV2D_ACT, "residual, silu", (cx, cw, cb, *geometry, 1, None, None, "silu", res), **conv)
    add(bo.CONV2D_ACT, "depthwise, stride 2", (cx, _randn(6, 1, 3, 3, seed=4), None, [2, 2], [1, 1], [1, 1], 6,
                                               0.0, 6.0), **conv)
    add(bo.CONV2D_BN_ACT, "relu", (cx, cw, cb, *_bn(12), *geometry, 1, 0.0, None), **conv)
    add(bo.CONV2D_BN_ACT, "residual", (cx, cw, None, *_bn(12), *geometry, 1, None, None, "none", res), **conv)
    lx, lw, lb = _randn(3, 5, 16), _randn(8, 16, seed=1), _randn(8, seed=2)
    add(bo.LINEAR_ACT, "gelu, residual", (lx, lw, lb, None, None, "gelu", _randn(3, 5, 8, seed=3)), tol=GEMM_TOL)
    add(bo.LINEAR_ACT, "clamp, no bias", (lx[0], lw, None, -0.5, 0.5), tol=GEMM_TOL)
    add(bo.LINEAR_BN_ACT, "relu", (lx[0], lw, lb, *_bn(8), 0.0, None), tol=GEMM_TOL)

    px = _randn(2, 4, 9, 11)
    add(bo.MAX_POOL2D, "3x3 s2 p1 ceil", (px, [3, 3], [2, 2], [1, 1], [1, 1], True))
    add(bo.AVG_POOL2D, "3x2 s(2,1) p(1,0)", (px, [3, 2], [2, 1], [1, 0], False, False, None))
    add(bo.MEAN_HW, "keepdim", (px, True))
    add(bo.MEAN_HW, "3-D, no keepdim", (px[0], False))

    add(bo.SDPA, "mask", (_randn(1, 2, 5, 8), _randn(1, 2, 7, 8, seed=1), _randn(1, 2, 7, 6, seed=2),
                          _randn(5, 7, seed=3), 0.3), tol=GEMM_TOL)
    add(bo.SDPA, "grouped heads, no mask", (_randn(1, 4, 9, 8), _randn(1, 2, 6, 8, seed=1), _randn(1, 2, 6, 8, seed=2)),
        tol=GEMM_TOL)
    nx = _randn(3, 5, 16) * 3 + 1
    add(bo.RMS_NORM, "weight", (nx, _randn(16, seed=1), 1e-5))
    add(bo.RMS_NORM, "no weight", (nx, None, 1e-6))
    add(bo.LAYER_NORM, "affine", (nx, _randn(16, seed=1), _randn(16, seed=2), 1e-5), tol=dict(rtol=1e-4, atol=5e-5))
    add(bo.PERMUTE_COPY, "float", (x4, [0, 2, 3, 1]))
    add(bo.PERMUTE_COPY, "int64", (torch.randint(0, 100, (3, 4, 5), generator=_g()), [2, 0, 1]))

    q4 = _q((8, 64), I8, lo=-8, hi=7)
    packed4 = bo.PACK_INT4.pattern(q4)
    scales, zp = torch.rand(8, 2, generator=_g(1)) * 0.1 + 0.01, _q((8, 2), I8, seed=2, lo=-3, hi=3)
    # weight, scales and zero points contiguous: the kernel says so otherwise (test_contiguous_only_arguments)
    qw = dict(tol=GEMM_TOL, fixed=(1, 2, 3))
    add(bo.LINEAR_QW, "4 bits, residual", (_randn(3, 64), packed4, scales, zp, 4, _randn(8, seed=3), "silu",
                                           _randn(3, 8, seed=4)), **qw)
    add(bo.LINEAR_QW, "8 bits", (_randn(2, 3, 64), _q((8, 64)), scales, None, 8), **qw)
    add(bo.PACK_INT4, "", (q4,))
    q8 = _q((8, 64))
    dq = dict(tol=GEMM_TOL, fixed=(1, 2, 3, 4))
    add(bo.LINEAR_DQ, "4 bits, residual", (_randn(3, 64), packed4, bo.WEIGHT_ROW_SUMS.pattern(q4, scales, zp), scales, zp, 4,
                                           _randn(8, seed=3), "silu", _randn(3, 8, seed=4)), **dq)
    add(bo.LINEAR_DQ, "8 bits", (_randn(2, 3, 64), q8, bo.WEIGHT_ROW_SUMS.pattern(q8, scales, None), scales, None, 8),
        **dq)
    add(bo.WEIGHT_ROW_SUMS, "zero points", (q8, scales, zp))
    add(bo.WEIGHT_ROW_SUMS, "per channel", (q8, scales[:, 0], None))

    cache = _randn(1, 4, 10, 6)
    add(bo.UPDATE_CACHE, "prefill of 2", (cache, _randn(1, 4, 2, 6, seed=1), torch.tensor([3, 4]), 2))
    add(bo.UPDATE_CACHE, "broadcast values", (cache, _randn(4, 1, 6, seed=1), torch.tensor([9]), 2))
    theta = torch.rand(1, 9, 1, 8, generator=_g(1)) * 6
    add(bo.ROPE, "llama prefill", (_randn(1, 9, 4, 16), theta.cos(), theta.sin()))

    # a packed weight is pack_gemm_weight's contiguous panels (test_contiguous_only_arguments)
    packed = dict(tol=GEMM_TOL, fixed=(1,))
    add(bo.LINEAR_PACKED_ACT, "residual", (_randn(3, 16), _packed(lw), 8, lb, None, None, "none",
                                           _randn(3, 8, seed=3)), **packed)
    add(bo.CONV2D_PACKED_ACT, "relu6", (cx, _packed(cw), list(cw.shape), cb, *geometry, 0.0, 6.0), **packed)
    add(bo.CONV2D_BN_PACKED_ACT, "residual", (cx, _packed(cw), list(cw.shape), cb, *_bn(12), *geometry, 0.0, None,
                                              "none", res), **packed)

    for dtype in (I8, U8):
        qx, qw, ws, qzp, qb, (xs, xz, os_, oz, lo, hi) = _conv_q(dtype)
        add(bo.QUANTIZED_CONV2D, f"{dtype}", (qx, xs, xz, qw, ws, qzp, qb, *geometry, 1, os_, oz, lo, hi))
        add(bo.QUANTIZED_CONV2D_PACKED, f"{dtype}", (qx, xs, xz, _packed(qw), list(qw.shape), ws, qb, *geometry, os_,
                                                     oz, lo, hi), fixed=(3,))
        ql, qlw = _q((3, 20), dtype, seed=5), torch.randint(-127, 128, (9, 20), dtype=I8, generator=_g(6))
        lws, lbias = torch.rand(9, generator=_g(7)) * 1e-2, _randn(9, seed=8)
        add(bo.QUANTIZED_LINEAR, f"{dtype}", (ql, 0.1, lo + 2, qlw, lws, _q((9,), I8, 9, -3, 3).long(), lbias, 0.2,
                                              lo + 5, lo, hi))
        add(bo.QUANTIZED_LINEAR_PACKED, f"{dtype}", (ql, 0.1, lo + 2, _packed(qlw), 9, lws, lbias, 0.2, lo + 5, lo, hi),
            fixed=(3,))

    qa, qb4 = _q((2, 3, 4, 5)), _q((1, 3, 1, 5), seed=1)
    binary = (0.1, 3, -128, 127, qb4, 0.2, -4, -128, 127, 0.3, 1, -128, 127)
    for op in (bo.QUANTIZED_OPS[0], bo.QUANTIZED_OPS[1]):  # add, add_relu
        add(op, "int8, broadcast", (qa, *binary))
        ua, ub = _q((4, 6), U8), _q((4, 6), U8, seed=1)
        add(op, "uint8", (ua, 0.05, 120, 0, 255, ub, 0.07, 130, 0, 255, 0.1, 128, 0, 255))
    add(bo.QUANTIZED_OPS[2], "int8", (qa, 0.1, 3, -128, 127, I8, 0.5, 0.3, 1, -128, 127, I8))  # add.scalar

    from etfuse.backend_ops import embedding_ops as E

    idx = torch.tensor([[0, 11, 5], [5, 3, 7]])
    for bits, (lo, hi), plain, dtyped in ((8, (-128, 127), E.EMBEDDING_BYTE, E.EMBEDDING_BYTE_DTYPE),
                                          (4, (-8, 7), E.EMBEDDING_4BIT, E.EMBEDDING_4BIT_DTYPE),
                                          (2, (-2, 1), E.EMBEDDING_2BIT, E.EMBEDDING_2BIT_DTYPE)):
        values = _q((12, 64), I8, lo=lo, hi=hi)
        table = values if bits == 8 else E._pack_embedding_weight(values, bits)
        es, ez = torch.rand(12, 4, generator=_g(1)) * 0.05 + 1e-3, _q((12, 4), I8, 2, lo, hi)
        add(plain, "groups of 16", (table, es, ez, lo, hi, idx))
        add(plain, "per row, no zero points", (table, es[:, 0].contiguous(), None, lo, hi, idx[0]))
        add(dtyped, "float16 out", (table, es.half(), ez, lo, hi, idx), {"dtype": F16})
    wrap_values, wrap_zps = _q((12, 64), I8, 3, -128, 127), _q((12, 4), I8, 4, -128, 127)
    wrap_values[0], wrap_zps[0] = 127, -128  # q - zp wraps to -1
    add(E.EMBEDDING_BYTE_INT8_ZP, "int8 zero points at the ends", (wrap_values, es, wrap_zps, -128, 127, idx))
    add(E.EMBEDDING_BYTE_INT8_ZP, "bfloat16 out, per row", (wrap_values, es[:, :1].contiguous(), wrap_zps[:, :1].contiguous(),
                                                           -128, 127, idx), {"dtype": BF16})
    for op, bits, (lo, hi) in ((E.EMBEDDING_4BIT_INT8_ZP, 4, (-8, 7)), (E.EMBEDDING_2BIT_INT8_ZP, 2, (-2, 1))):
        packed = E._pack_embedding_weight(_q((12, 64), I8, 5, lo, hi), bits)
        add(op, "int8 zero points outside the width", (packed, es, wrap_zps, lo, hi, idx))
        add(op, "bfloat16 out, per row", (packed, es[:, :1].contiguous(), wrap_zps[:, :1].contiguous(), lo, hi, idx),
            {"dtype": BF16})
    add(bo.PACK_EMBEDDING_WEIGHT, "4 bits", (_q((6, 8), I8, lo=-8, hi=7), 4))
    add(bo.PACK_EMBEDDING_WEIGHT, "2 bits", (_q((6, 8), I8, lo=-2, hi=1), 2))

    from etfuse.backend_ops.quantized_ops import DEQUANTIZE_PER_CHANNEL, DEQUANTIZE_PER_TENSOR, QUANTIZE_PER_TENSOR

    add(QUANTIZE_PER_TENSOR, "int8", (_randn(2, 3, 4, 5) * 4, 0.05, 2, -128, 127, I8))
    add(QUANTIZE_PER_TENSOR, "uint8", (_randn(4, 6) * 4, 0.05, 128, 0, 255, U8))
    add(DEQUANTIZE_PER_TENSOR, "int8", (qa, 0.05, 2, -128, 127, I8))
    add(DEQUANTIZE_PER_CHANNEL, "axis 0", (_q((4, 6)), torch.rand(4, generator=_g(1)) + 0.01,
                                           _q((4,), I8, 2, -3, 3).long(), 0, -128, 127, I8))
    add(DEQUANTIZE_PER_CHANNEL, "axis 1, no zero points", (qa, torch.rand(3, generator=_g(1)) + 0.01, None, 1, -128,
                                                           127, I8))
    return s


SAMPLES = _samples()
KERNEL_OPS = [runtime_op(op) for op in bo.CATALOG if op.kernel and runtime_op(op) is op]
CASES = [(op, *sample) for op, samples in SAMPLES.items() for sample in samples]


def _id(case):
    op, label = case[0], case[1]
    return f"{op.namespace}::{op.name}" + (f"[{label}]" if label else "")


def test_every_kernel_has_samples():
    """A kernel file's op without samples here is a kernel nobody checks against its pattern."""
    assert sorted(op.qualname for op in KERNEL_OPS if op not in SAMPLES) == []


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_eager_kernel_matches_its_pattern_in_every_layout(kernel_check, case):
    op, _, args, kwargs, options = case
    kernel_check.layouts(op, args, kwargs, **options)


@pytest.mark.parametrize("op", list(SAMPLES), ids=lambda op: f"{op.namespace}::{op.name}")
def test_runtime_kernel_matches_its_pattern(kernel_check, op):
    """One program per op: each sample as given and with its 4-D inputs channels-last (a dim order
    the runtime takes; strided views it does not, so they are eager's cases)."""
    samples = SAMPLES[op]
    for kwargs in {tuple(sorted(k.items())) for _, _, k, _ in samples}:
        cases = []
        for _, args, k, options in samples:
            if tuple(sorted(k.items())) != kwargs:
                continue
            cases.append(list(args))
            cl = kernel_check.channels_last_case(args)
            if cl is not None:
                cases.append(cl)
        tol = next((o["tol"] for _, _, _, o in samples if "tol" in o), None)
        kernel_check.runtime(op, cases, dict(kwargs), tol=tol)


def _conv_weight_cases():
    import kernel_checks

    for op in (bo.CONV2D_ACT, bo.CONV2D_BN_ACT):
        for label, args, _, options in SAMPLES[op]:
            for name in kernel_checks.variants(args[1]):
                yield pytest.param(op, args, name, options["tol"], id=f"{op.name}[{label}]-{name}")


@pytest.mark.parametrize("op, args, layout, tol", list(_conv_weight_cases()))
def test_conv_kernels_read_strided_weights(kernel_check, op, args, layout, tol):
    weight = kernel_check.variants(args[1])[layout]
    kernel_check.eager(op, (args[0], weight, *args[2:]), tol=tol, want=kernel_check.expected(op, args),
                       what=f"weight {layout} {tuple(weight.stride())}")


def _contiguous_only():
    """(op, sample, argument position): inputs a kernel takes contiguous only, saying so."""
    for op, positions in ((bo.LINEAR_QW, (1, 2, 3)), (bo.LINEAR_DQ, (1, 2, 3, 4)), (bo.LINEAR_PACKED_ACT, (1,)), (bo.CONV2D_PACKED_ACT, (1,)),
                          (bo.CONV2D_BN_PACKED_ACT, (1,)), (bo.QUANTIZED_CONV2D_PACKED, (3,)),
                          (bo.QUANTIZED_LINEAR_PACKED, (3,))):
        label, args, _, _ = SAMPLES[op][0]
        for i in positions:
            if args[i] is not None:
                yield pytest.param(op, args, i, id=f"{op.name}-{op.arg_names[i]}")


@pytest.mark.parametrize("op, args, position", list(_contiguous_only()))
def test_contiguous_only_arguments_are_named_errors(kernel_check, op, args, position):
    """Packed weights (pack_gemm_weight's panels, pack_int4's bytes) and linear_qw's and
    linear_dq's scales and zero points are read as laid out: another layout is an error naming
    the argument, never another result."""
    want = kernel_check.expected(op, args)
    for name, v in kernel_check.variants(args[position]).items():
        bad = [v if j == position else a for j, a in enumerate(args)]
        with pytest.raises(RuntimeError, match=rf"{op.arg_names[position]} must be contiguous"):
            op.aten_out(*bad, out=torch.empty(0, dtype=want.dtype))


_EMPTY_QUANTIZED_ADD = """
import sys, torch
sys.path.insert(0, {tests!r})
from conftest import load_kernels
load_kernels(eager=True)
q, I8 = torch.zeros({shape}, dtype=torch.int8), torch.int8
ops = torch.ops.etfuse
out = {call}
assert out.shape == q.shape, out.shape
"""


@pytest.mark.parametrize("call", [
    "ops.quantized_decomposed_add.out(q, 0.1, 3, -128, 127, q, 0.2, -4, -128, 127, 0.3, 1, -128, 127, out=torch.empty(0, dtype=I8))",
    "ops.quantized_decomposed_add_relu.out(q, 0.1, 3, -128, 127, q[:1], 0.2, -4, -128, 127, 0.3, 1, -128, 127, out=torch.empty(0, dtype=I8))",
    "ops.quantized_decomposed_add.scalar_out(q, 0.1, 3, -128, 127, I8, 0.5, 0.3, 1, -128, 127, I8, out=torch.empty(0, dtype=I8))",
], ids=["add", "add_relu", "add.scalar"])
def test_quantized_adds_of_empty_inputs(call):
    """An empty input ([0, 3]) gives an empty output, as the float element-wise kernels do (in a
    child process: an empty output once divided by zero and killed it)."""
    import os
    import subprocess
    import sys

    code = _EMPTY_QUANTIZED_ADD.format(tests=os.path.dirname(__file__), shape=(0, 3), call=call)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr[-1500:]}"


class _Cache(torch.nn.Module):
    """A KV-cache buffer written at `positions` along dim 2, read after the write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 4, 10, 6))

    def forward(self, values, positions):
        self.k[:, :, positions] = values
        return self.k * 1.0


def test_update_cache_in_place_kernel_on_the_runtime():
    """`update_cache_` has a runtime kernel only (in torch it is the reference kernel: the pattern,
    copied into self): a fused program's cache write runs it in place, and each call reads what
    the ones before it wrote."""
    import etfuse
    from etfuse.runtime import load_method

    from fusion_helpers import edge_program, plan_ops

    args = (torch.randn(1, 4, 2, 6), torch.tensor([3, 4]))
    pte = etfuse.fuse(edge_program(_Cache(), args)).to_executorch()
    assert "etfuse::update_cache_." in plan_ops(pte)
    method, eager = load_method(pte), _Cache()
    for step in range(3):
        values, positions = torch.randn(1, 4, 2, 6, generator=_g(step)), torch.tensor([step, 9 - step])
        torch.testing.assert_close(method.execute((values, positions))[0], eager(values, positions), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# element-wise binary ops: broadcasting and inputs sharing storage

FLOAT_BINARY = [bo.ADD_RELU, bo.MUL, bo.ADD]
QUANTIZED_BINARY = [runtime_op(bo.QUANTIZED_OPS[0]), runtime_op(bo.QUANTIZED_OPS[1])]


def _quantized_args(a, b):
    return (a, 0.1, 3, -128, 127, b, 0.2, -4, -128, 127, 0.3, 1, -128, 127)


def _int8(shape, generator):
    return torch.randint(-128, 128, shape, dtype=I8, generator=generator)


def _binary_cases(op, kernel_check):
    """(self, other) on every broadcast pair of kernel_checks.BROADCAST_SHAPES, both orders, as
    `op`'s arguments."""
    if op in FLOAT_BINARY:
        return [(a, b) for a, b in kernel_check.broadcast_pairs()]
    # (empty inputs abort the process: test_quantized_adds_of_empty_inputs)
    shapes = [(sa, sb) for sa, sb in kernel_check.BROADCAST_SHAPES if 0 not in (*sa, *sb)]
    return [_quantized_args(a, b) for a, b in kernel_check.broadcast_pairs(shapes, make=_int8)]


@pytest.mark.parametrize("op", FLOAT_BINARY + QUANTIZED_BINARY, ids=lambda op: op.name)
def test_binary_kernels_broadcast_like_the_pattern(kernel_check, op):
    """Every pair in eager (and each in every layout of its operands), then all of them in one
    program on the runtime."""
    cases = _binary_cases(op, kernel_check)
    for args in cases:
        kernel_check.layouts(op, args)
    kernel_check.runtime(op, [list(a) for a in cases])


@pytest.mark.parametrize("op", FLOAT_BINARY + QUANTIZED_BINARY, ids=lambda op: op.name)
def test_binary_kernels_read_inputs_that_share_storage(kernel_check, op):
    """`x` with `x[:1]` (either order), with itself, with its own transpose; out being one of
    them (the pattern's result, as if computed into a fresh tensor)."""
    x = torch.randn(3, 4, 6, 6, generator=_g(5))
    if op in QUANTIZED_BINARY:
        x = _int8((3, 4, 6, 6), _g(5))
    for a, b in kernel_check.aliased_views(x):
        args = (a, b) if op in FLOAT_BINARY else _quantized_args(a, b)
        kernel_check.eager(op, args, what=f"{tuple(a.shape)} and {tuple(b.shape)} views of one storage")
    for name, views in (("out is self, other its x[:1]", lambda y: (y, y[:1])),
                        ("out is other, self its x[:1]", lambda y: (y[:1], y)),
                        ("out is self, other its transpose", lambda y: (y, y.transpose(-1, -2)))):
        y = x.clone()
        a, b = views(y)
        args = (a, b) if op in FLOAT_BINARY else _quantized_args(a, b)
        kernel_check.eager(op, args, out=y, want=kernel_check.expected(op, args), what=name)
