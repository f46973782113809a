"""Triton kernels (etfuse.kernels.triton), checked on a machine without a GPU.

Three child processes run side by side (one fixture), so this process never imports triton
with TRITON_INTERPRET set and never registers CUDA kernels itself:

* interpret: TRITON_INTERPRET=1, every kernel runs through Triton's interpreter on CPU tensors
  and is compared with its op's pattern: bit-exact for the quantized kernels (and with the C++
  kernels when they are built), to float tolerance for the float ones; sizes that are not
  multiples of the block, broadcasting, non-contiguous operands, every dtype;
* ptx: each kernel family, per dtype, compiled for sm_90 (PTX and cubin) without a GPU; the
  quantized kernels' PTX has no FMA and keeps the round-half-to-even adds;
* register: the torch.library registrations (CUDA / AutogradCUDA / .out CUDA), fake CUDA
  tensors, export of a CUDA program, CPU programs still retracing to their patterns, and
  etfuse importing without triton.

Each case reports on its own (one test each). The file is also the child's entry point:
`python tests/test_triton.py interpret|ptx|register` prints one JSON line of results.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import sys
import time
import traceback

import pytest

HAVE_TRITON = importlib.util.find_spec("triton") is not None
MARK = "ETFUSE-TRITON-RESULTS "

INTERPRET_CASES: dict = {}
REGISTER_CASES: dict = {}


def _case(table):
    def deco(fn):
        table[fn.__name__] = fn
        return fn
    return deco


# ---- interpreter cases (child process, TRITON_INTERPRET=1) ------------------------------

def _torch():
    import torch
    return torch


def _cpp_loaded() -> bool:
    """The C++ kernels, when they are built already (never builds here)."""
    try:
        from etfuse.kernels import build, cache
        import etfuse.kernels as k
        if k.is_loaded() and k.info().eager is not None:
            return True
        if not cache._complete(cache.cache_root() / build.cache_key()):
            return False
        k.load(eager=True)
        return True
    except Exception:  # noqa: BLE001 - the comparison with C++ is extra; the pattern is the spec
        return False


def _close(got, want, **tol):
    torch = _torch()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    torch.testing.assert_close(got, want, **tol)


def _equal(got, want):
    torch = _torch()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if not torch.equal(got, want):
        diff = (got.to(torch.int32) - want.to(torch.int32)).abs() if not got.is_floating_point() else (got - want).abs()
        raise AssertionError(f"not bit-exact: {int((got != want).sum())} elements differ, max diff {diff.max().item()}")


_FLOAT_SHAPES = [
    ((1000,), (1000,)),            # one run, 1000 = 3 * 256 + 232: the last block is masked
    ((37, 129), (129,)),           # trailing broadcast
    ((37, 1), (1, 129)),           # both broadcast
    ((3, 1, 5, 7), (4, 1, 1)),     # broadcast on several dims
    ((), (31,)),                   # 0-d operand
    ((0, 5), (5,)),                # empty
]


@_case(INTERPRET_CASES)
def add_relu_float():
    torch = _torch()
    from etfuse.backend_ops.float_ops import ADD_RELU
    from etfuse.kernels.triton import launch
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for sa, sb in _FLOAT_SHAPES if dtype != torch.bfloat16 else _FLOAT_SHAPES[:2]:
            a = torch.randn(sa, generator=g).to(dtype)
            b = torch.randn(sb, generator=g).to(dtype)
            _close(launch.add_relu(a, b, block=256), ADD_RELU.pattern(a, b))
            _close(launch.add_relu(b, a, block=256), ADD_RELU.pattern(b, a))
        # non-contiguous operands (a transposed view; an expanded one)
        a = torch.randn(65, 40, generator=g).to(dtype).t()
        b = torch.randn(40, 1, generator=g).to(dtype).expand(40, 65)
        _close(launch.add_relu(a, b, block=128), ADD_RELU.pattern(a, b))
    a = torch.tensor([float("nan"), -1.0, 2.0])
    _close(launch.add_relu(a, torch.zeros(3)), torch.relu(a), equal_nan=True)


@_case(INTERPRET_CASES)
def add_relu_registered_kernels():
    """The CUDA-key kernels are plain functions: run them on CPU tensors here (out variant,
    aliasing out, fallback to the pattern for what the kernel does not cover)."""
    torch = _torch()
    from etfuse.backend_ops.float_ops import ADD_RELU
    from etfuse.kernels.triton import launch, registration
    fn = registration._functional(ADD_RELU, launch.add_relu)
    out_fn = registration._out(ADD_RELU, launch.add_relu)
    a, b = torch.randn(6, 7), torch.randn(7)
    _close(fn(a, b), ADD_RELU.pattern(a, b))
    o = torch.empty(0)
    assert out_fn(a, b, out=o) is o
    _close(o, ADD_RELU.pattern(a, b))
    o = torch.empty(7, 6).t()  # non-contiguous out
    out_fn(a, b, out=o)
    _close(o, ADD_RELU.pattern(a, b))
    a2, want = a.clone(), ADD_RELU.pattern(a, b)
    out_fn(a2, b, out=a2)  # out aliases an input
    _close(a2, want)
    # outside the kernel: 5 dims left after collapsing, mixed dtypes, an integer dtype -> pattern
    x = torch.randn(2, 1, 3, 1, 2, 1, 2, 1, 3)
    y = torch.randn(1, 2, 1, 3, 1, 2, 1, 3, 1)
    try:
        launch.add_relu(x, y)
        raise AssertionError("expected Unsupported")
    except launch.Unsupported:
        pass
    _close(fn(x, y), ADD_RELU.pattern(x, y))
    x32, y64 = torch.randn(4), torch.randn(4, dtype=torch.float64)
    _close(fn(x32, y64), ADD_RELU.pattern(x32, y64))
    ints = torch.arange(-3, 3)
    _equal(fn(ints, ints), ADD_RELU.pattern(ints, ints))


def _qparam_sets(dtype):
    torch = _torch()
    lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
    g = torch.Generator().manual_seed(1)
    sets = [
        # ties: x + y are multiples of 0.5 with out_scale 1 -> s * inv lands on .5 often
        (0.5, 0, 0.5, 0, 1.0, (lo + hi + 1) // 2),
        (0.25, lo + 3, 0.75, hi - 7, 0.5, lo + 10),
        (1e-3, 0, 2e-3, 0, 1e-5, 0 if lo == 0 else -1),   # saturates
        (3.0, hi, 5.0, lo, 1e3, lo),                       # everything rounds to zp
    ]
    for _ in range(6):
        s = [float(torch.empty(1).uniform_(1e-3, 0.2, generator=g)) for _ in range(3)]
        z = [int(torch.randint(lo, hi + 1, (1,), generator=g)) for _ in range(3)]
        sets.append((s[0], z[0], s[1], z[1], s[2], z[2]))
    return [(sa, za, lo, hi, sb, zb, lo, hi, so, zo, lo, hi) for sa, za, sb, zb, so, zo in sets]


def _exhaustive(dtype):
    """Every (a, b) pair of the dtype: a [256, 1] against b [1, 256]."""
    torch = _torch()
    lo = -128 if dtype == torch.int8 else 0
    v = torch.arange(lo, lo + 256, dtype=torch.int32).to(dtype)
    return v.reshape(256, 1), v.reshape(1, 256)


def _exhaustive_cases():
    """(key, dtype, relu, qparams) of the exhaustive bit-exactness checks, shared by the
    interpreter child (Triton outputs) and the register child (C++ outputs)."""
    torch = _torch()
    for dtype in (torch.int8, torch.uint8):
        for i, qp in enumerate(_qparam_sets(dtype)[:4]):
            for relu in (False, True):
                yield f"{dtype}-{i}-{'add_relu' if relu else 'add'}", dtype, relu, qp


@_case(INTERPRET_CASES)
def quantized_add_and_add_relu_bit_exact():
    torch = _torch()
    from etfuse.backend_ops import quantized_ops as q
    from etfuse.kernels.triton import launch
    dump = {}
    # every input pair, under qparams that hit ties, saturation and random scales
    for key, dtype, relu, qp in _exhaustive_cases():
        a, b = _exhaustive(dtype)
        op = q.QUANTIZED_ADD_RELU if relu else q.QUANTIZED_ADD
        args = (a, *qp[:4], b, *qp[4:])
        got = launch.quantized_add(*args, relu=relu, block=8192)
        _equal(got, op.pattern(*args))
        dump[key] = got
    g = torch.Generator().manual_seed(2)
    shapes = [((1000,), (1000,)), ((37, 129), (129,)), ((1, 129), (37, 1)), ((5, 3, 7), ()), ((0, 3), (3,))]
    checked = len(dump)
    for dtype in (torch.int8, torch.uint8):
        lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255)
        sets = _qparam_sets(dtype)
        for relu, op in ((False, q.QUANTIZED_ADD), (True, q.QUANTIZED_ADD_RELU)):
            for i, (sa, sb) in enumerate(shapes + [shapes[1]] * 5):   # masking/broadcast shapes, more qparams
                qp = sets[(i + 5) % len(sets)]
                a = torch.randint(lo, hi + 1, sa, generator=g, dtype=torch.int32).to(dtype)
                b = torch.randint(lo, hi + 1, sb, generator=g, dtype=torch.int32).to(dtype)
                args = (a, *qp[:4], b, *qp[4:])
                _equal(launch.quantized_add(*args, relu=relu, block=256), op.pattern(*args))
                checked += 1
        # a strided (transposed) operand
        a = torch.randint(lo, hi + 1, (40, 33), generator=g, dtype=torch.int32).to(dtype).t()
        b = torch.randint(lo, hi + 1, (33, 40), generator=g, dtype=torch.int32).to(dtype)
        args = (a, 0.05, 0 if lo == 0 else 3, lo, hi, b, 0.02, 0, lo, hi, 0.07, 1, lo, hi)
        _equal(launch.quantized_add(*args, relu=True, block=128), q.QUANTIZED_ADD_RELU.pattern(*args))
    if os.environ.get("ETFUSE_TRITON_DUMP"):
        torch.save(dump, os.path.join(os.environ["ETFUSE_TRITON_DUMP"], "triton.pt"))
    return f"{checked} launches bit-exact with the pattern ({len(dump)} of them over every input pair)"


@_case(INTERPRET_CASES)
def quantized_add_errors_match_cpp():
    torch = _torch()
    from etfuse.kernels.triton import launch
    a = torch.zeros(4, dtype=torch.int8)
    bad = [
        ((a, 0.1, 200, -128, 127, a, 0.1, 0, -128, 127, 0.1, 0, -128, 127), "a_zero_point 200 is outside"),
        ((a, 0.0, 0, -128, 127, a, 0.1, 0, -128, 127, 0.1, 0, -128, 127), "a_scale must be finite and > 0"),
        ((a, 0.1, 0, -128, 127, a, 0.1, 0, -128, 127, 0.1, 0, 0, 255), "out quant range [0, 255] is not inside int8's"),
        ((a, 0.1, 0, -128, 127, a.to(torch.uint8), 0.1, 0, 0, 255, 0.1, 0, -128, 127), "must share one dtype"),
    ]
    for args, text in bad:
        try:
            launch.quantized_add(*args)
            raise AssertionError(f"expected an error containing {text!r}")
        except RuntimeError as e:
            assert text in str(e), str(e)


@_case(INTERPRET_CASES)
def linear_relu_and_addmm_relu():
    torch = _torch()
    from etfuse.backend_ops.float_ops import ADDMM_RELU, LINEAR_RELU
    from etfuse.kernels.triton import launch
    g = torch.Generator().manual_seed(3)
    small = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)
    for dtype, tol in ((torch.float32, dict(rtol=1e-4, atol=1e-4)), (torch.float16, dict(rtol=1e-2, atol=1e-2))):
        r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
        ref = lambda f, *xs: f(*[x.float() if x is not None else None for x in xs]).to(dtype)  # noqa: E731
        for M, N, K in ((33, 45, 70), (16, 64, 32), (1, 7, 5)):   # masked M/N/K; even K; tiny
            x, w, b = r(M, K), r(N, K), r(N)
            _close(launch.linear_relu(x, w, b, config=small), ref(LINEAR_RELU.pattern, x, w, b), **tol)
            _close(launch.linear_relu(x, w, None, config=small), ref(LINEAR_RELU.pattern, x, w, None), **tol)
            m2 = r(K, N)
            for bias in (r(N), r(M, N), r(M, 1), r(1, N)):
                _close(launch.addmm_relu(bias, x, m2, config=small), ref(ADDMM_RELU.pattern, bias, x, m2), **tol)
        # 3-D input, weight stored transposed (non-contiguous), default tiles
        x, wt, b = r(2, 5, 40), r(40, 24), r(24)
        _close(launch.linear_relu(x, wt.t(), b), ref(LINEAR_RELU.pattern, x, wt.t(), b), **tol)
        # K == 0: relu(bias)
        bias = r(3, 4)
        _close(launch.addmm_relu(bias, r(3, 0), r(0, 4)), torch.relu(bias))


@_case(INTERPRET_CASES)
def embedding_byte_bit_exact():
    torch = _torch()
    from etfuse.backend_ops.quantized_ops import EMBEDDING_BYTE
    from etfuse.kernels.triton import launch
    g = torch.Generator().manual_seed(4)
    checked = 0
    for wdtype, (lo, hi) in ((torch.int8, (-128, 127)), (torch.uint8, (0, 255))):
        for sdtype in (torch.float32, torch.float16):
            for zp_kind in (None, "int64", "float32", "int8"):
                for idx_dtype, idx_shape in ((torch.int64, (4, 7)), (torch.int32, (37,))):
                    rows, D = 50, 33  # D = 2 * 16 + 1: the last column block is masked
                    w = torch.randint(lo, hi + 1, (rows, D), generator=g, dtype=torch.int32).to(wdtype)
                    scales = (torch.rand(rows, generator=g) * 0.1 + 1e-3).to(sdtype)
                    if sdtype == torch.float16:
                        scales = scales.reshape(rows, 1)
                    zps = None
                    if zp_kind is not None:
                        zps = torch.randint(lo, hi + 1, (rows,), generator=g, dtype=torch.int32)
                        zps = zps.to(getattr(torch, zp_kind)) if zp_kind != "int8" else zps.clamp(-128, 127).to(torch.int8)
                    idx = torch.randint(0, rows, idx_shape, generator=g).to(idx_dtype)
                    args = (w, scales, zps, lo, hi, idx)
                    got = launch.embedding_byte(*args, block_rows=8, block_d=16)
                    _equal(got, EMBEDDING_BYTE.pattern(*args))
                    checked += 1
    # a transposed (strided) weight, default blocks
    w = torch.randint(-128, 128, (20, 64), generator=g, dtype=torch.int32).to(torch.int8).t()
    args = (w, torch.rand(64, generator=g), None, -128, 127, torch.tensor([0, 63, 5]))
    _equal(launch.embedding_byte(*args), EMBEDDING_BYTE.pattern(*args))
    try:
        launch.embedding_byte(w, torch.rand(64), None, -128, 127, torch.tensor([64]))
        raise AssertionError("expected an out-of-range error")
    except RuntimeError as e:
        assert "index 64 is out of range for 64 rows" in str(e), str(e)
    return f"{checked} combinations bit-exact with the pattern"


@_case(INTERPRET_CASES)
def quantized_qparams_checked_in_float32():
    """out_scale=1e-45: 1/scale overflows float32 (the kernel's precision): an error naming the
    op and parameter, the C++ kernels' text, instead of NaN converted to int8."""
    torch = _torch()
    from etfuse.kernels.triton import launch
    a = torch.zeros(40, dtype=torch.int8)
    for relu, name in ((False, "add"), (True, "add_relu")):
        try:
            launch.quantized_add(a, 0.1, 0, -128, 127, a, 0.1, 0, -128, 127, 1e-45, 0, -128, 127, relu=relu, block=16)
            raise AssertionError("expected a RuntimeError")
        except RuntimeError as e:
            want = (f"quantized_decomposed::{name}: out_scale 1e-45 is too small: 1/scale = 1e+45 overflows float32 "
                    "(the kernel computes in float32; scale must be >= 2.93874e-39)")
            assert str(e) == want, str(e)
        for bad, why in ((1e37, "is too large"), (1e39, "is not a finite float32 > 0")):
            try:
                launch.quantized_add(a, bad, 0, -128, 127, a, 0.1, 0, -128, 127, 0.1, 0, -128, 127, relu=relu, block=16)
                raise AssertionError("expected a RuntimeError")
            except RuntimeError as e:
                assert f"{name}: a_scale {bad:g} {why}" in str(e), str(e)
    got = launch.quantized_add(a, 0.1, 0, -128, 127, a, 0.1, 0, -128, 127, 3e-39, 0, -128, 127, relu=True, block=16)
    assert got.tolist() == [0] * 40
    if _cpp_loaded():  # the same text from the C++ kernel
        try:
            torch.ops.etfuse.quantized_decomposed_add_relu.out(a, 0.1, 0, -128, 127, a, 0.1, 0, -128, 127, 1e-45, 0,
                                                               -128, 127, out=torch.empty(0, dtype=torch.int8))
            raise AssertionError("expected a RuntimeError")
        except RuntimeError as e:
            assert want.replace("add_relu", "add_relu.out") in str(e), str(e)


@_case(INTERPRET_CASES)
def quantized_registered_kernels():
    torch = _torch()
    from etfuse.backend_ops import quantized_ops as q
    from etfuse.kernels.triton import launch, registration
    a = torch.randint(-128, 128, (9, 10), dtype=torch.int32).to(torch.int8)
    args = (a, 0.1, 2, -128, 127, a[0], 0.05, -1, -128, 127, 0.2, 0, -128, 127)
    for op, launcher in ((q.QUANTIZED_ADD, launch.quantized_add_op), (q.QUANTIZED_ADD_RELU, launch.quantized_add_relu_op)):
        _equal(registration._functional(op, launcher)(*args), op.pattern(*args))
        o = torch.empty(0, dtype=torch.int8)
        assert registration._out(op, launcher)(*args, out=o) is o
        _equal(o, op.pattern(*args))
    e = (torch.randint(0, 255, (6, 4), dtype=torch.int32).to(torch.uint8), torch.rand(6), None, 0, 255, torch.tensor([[1, 5]]))
    _equal(registration._functional(q.EMBEDDING_BYTE, launch.embedding_byte)(*e), q.EMBEDDING_BYTE.pattern(*e))


@_case(INTERPRET_CASES)
def gpu_benchmark_smoke_run():
    """benchmarks/gpu.py --smoke: every variant of the GPU benchmark, tiny, on the interpreter."""
    import contextlib
    import importlib.util as iu
    import io
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "gpu.py")
    spec = iu.spec_from_file_location("etfuse_gpu_benchmark", path)
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = mod.main(["--smoke"])
    assert rc == 0 and "linear_relu float16" in buf.getvalue(), buf.getvalue()


# ---- registration cases (child process, triton imported normally) ------------------------

_NO_TRITON_CODE = (
    "import sys; sys.modules['triton'] = None\n"
    "import etfuse.backend_ops, etfuse.backend_ops.quantized_ops\n"
    "import etfuse.kernels.triton as kt\n"
    "assert not kt.available() and kt.register_if_available() is False\n"
    "try:\n    kt.register()\nexcept kt.TritonUnavailableError as e:\n    print('MSG', e)\n"
    "else:\n    raise SystemExit('register() did not fail')\n"
    "try:\n    kt.launch\nexcept ImportError:\n    print('LAUNCH-REFUSED')\n")
_NO_TRITON_PROC = None  # started first by the register child, so it overlaps the other cases


def _start_no_triton():
    global _NO_TRITON_PROC
    _NO_TRITON_PROC = subprocess.Popen([sys.executable, "-c", _NO_TRITON_CODE], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)


@_case(REGISTER_CASES)
def imports_and_reports_without_triton():
    """etfuse imports with triton unimportable; only asking for a CUDA kernel says so."""
    if _NO_TRITON_PROC is None:
        _start_no_triton()
    stdout, stderr = _NO_TRITON_PROC.communicate(timeout=180)
    assert _NO_TRITON_PROC.returncode == 0, stderr[-3000:]
    assert "pip install \"etfuse[triton]\"" in stdout and "LAUNCH-REFUSED" in stdout, stdout


def _export(model, args):
    import torch
    return torch.export.export(model, args)


def _targets(ep):
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


@_case(REGISTER_CASES)
def registered_at_cuda_keys_only():
    import torch
    import etfuse.backend_ops
    import etfuse.kernels.triton as kt
    etfuse.backend_ops.install()  # the quantized_decomposed ops (importing the catalog registers etfuse's only)
    cpu_before = {}
    names = ["etfuse::add_relu", "etfuse::linear_relu", "etfuse::addmm_relu", "quantized_decomposed::add",
             "quantized_decomposed::add_relu", "quantized_decomposed::embedding_byte",
             "etfuse::quantized_decomposed_add", "etfuse::quantized_decomposed_add_relu",
             "etfuse::quantized_decomposed_embedding_byte"]
    # the quantized ops' `.out` kernels are their etfuse twins' (backend_ops/runtime_names.py)
    outs = ["etfuse::add_relu.out", "etfuse::linear_relu.out", "etfuse::addmm_relu.out",
            "etfuse::quantized_decomposed_add.out", "etfuse::quantized_decomposed_add_relu.out",
            "etfuse::quantized_decomposed_embedding_byte.out"]
    for n in names + outs:
        cpu_before[n] = [torch._C._dispatch_has_kernel_for_dispatch_key(n, k) for k in ("CPU", "CompositeImplicitAutograd",
                                                                                       "CompositeExplicitAutograd")]
    got = kt.register()
    assert kt.register() == got and kt.is_registered()
    assert len(got) == 24, got  # 9 functional ops x (CUDA, AutogradCUDA) + 6 `.out` x CUDA
    for n in names:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA"), n
        assert torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutogradCUDA"), n
    for n in outs:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA"), n
    for n in names + outs:
        after = [torch._C._dispatch_has_kernel_for_dispatch_key(n, k) for k in ("CPU", "CompositeImplicitAutograd",
                                                                               "CompositeExplicitAutograd")]
        assert after == cpu_before[n], (n, cpu_before[n], after)


@_case(REGISTER_CASES)
def cpu_programs_still_retrace_to_patterns():
    import torch
    import etfuse.kernels.triton as kt
    kt.register()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(6, 5))

        def forward(self, x, y):
            h = torch.ops.etfuse.add_relu(x, y)
            return torch.ops.etfuse.linear_relu(h, self.w, None)

    x, y = torch.randn(3, 5), torch.randn(5)
    ep = _export(M(), (x, y))
    assert "etfuse.add_relu.default" in _targets(ep), _targets(ep)
    dec = ep.run_decompositions()
    t = _targets(dec)
    assert not any("etfuse" in s for s in t) and "aten.relu.default" in t, t
    torch.testing.assert_close(dec.module()(x, y), ep.module()(x, y))
    # eager CPU calls still run the pattern / the CPU .out kernels, not the CUDA registrations
    torch.testing.assert_close(torch.ops.etfuse.add_relu(x, y), torch.relu(x + y))


@_case(REGISTER_CASES)
def fake_cuda_tensors_and_cuda_export():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    import etfuse.kernels.triton as kt
    kt.register()
    qd = torch.ops.quantized_decomposed
    with FakeTensorMode():
        a = torch.empty(4, 8, device="cuda")
        b = torch.empty(8, device="cuda")
        w = torch.empty(3, 8, device="cuda", dtype=torch.float16)
        r = torch.ops.etfuse.add_relu(a, b)
        assert r.shape == (4, 8) and r.device.type == "cuda"
        o = torch.empty(4, 8, device="cuda")
        assert torch.ops.etfuse.add_relu.out(a, b, out=o) is o
        r = torch.ops.etfuse.linear_relu(a.half(), w, None)
        assert r.shape == (4, 3) and r.dtype == torch.float16
        r = torch.ops.etfuse.addmm_relu(torch.empty(3, device="cuda"), torch.empty(8, 4, device="cuda"),
                                        torch.empty(4, 3, device="cuda"))
        assert r.shape == (8, 3)
        qa = torch.empty(4, 8, device="cuda", dtype=torch.int8)
        r = qd.add_relu(qa, 0.1, 0, -128, 127, qa, 0.1, 0, -128, 127, 0.2, 0, -128, 127)
        assert r.shape == (4, 8) and r.dtype == torch.int8 and r.device.type == "cuda"
        r = qd.embedding_byte(qa, torch.empty(4, device="cuda", dtype=torch.float16), None, -128, 127,
                              torch.empty(2, 3, device="cuda", dtype=torch.long))
        assert r.shape == (2, 3, 8) and r.dtype == torch.float16

        class M(torch.nn.Module):
            def forward(self, x, y):
                return torch.ops.etfuse.add_relu(x, y) * 2

        ep = torch.export.export(M(), (a, b))
    t = _targets(ep)
    assert "etfuse.add_relu.default" in t, t
    # Known and documented (registration.py): a program exported from CUDA tensors keeps the
    # fused op through run_decompositions(); exported from CPU tensors it retraces (above).
    assert "etfuse.add_relu.default" in _targets(ep.run_decompositions()), t
    # The AutogradCUDA kernel (plain function; a CPU-only torch cannot run autograd on CUDA
    # tensors, fake or not): inputs that require grad take the differentiable pattern.
    from etfuse.backend_ops.float_ops import ADD_RELU
    from etfuse.kernels.triton import registration
    x = torch.randn(4, 8, requires_grad=True)
    r = registration._autograd(ADD_RELU)(x, torch.randn(8))
    assert r.grad_fn is not None
    r.sum().backward()
    assert x.grad is not None


@_case(REGISTER_CASES)
def cpp_kernels_reference_outputs():
    """The C++ kernels' outputs for the exhaustive quantized checks (compared with the
    interpreter child's Triton outputs by test_quantized_bit_exact_with_cpp). Uses the C++
    kernels only when they are built already (tests/test_kernels.py builds them)."""
    torch = _torch()
    if not _cpp_loaded():
        return "C++ kernels not built: skipped"
    dump = {}
    for key, dtype, relu, qp in _exhaustive_cases():
        a, b = _exhaustive(dtype)
        out_op = torch.ops.etfuse.quantized_decomposed_add_relu.out if relu else torch.ops.etfuse.quantized_decomposed_add.out
        dump[key] = out_op(a, *qp[:4], b, *qp[4:], out=torch.empty(0, dtype=dtype))
    # the Triton launcher's errors use the C++ kernels' words
    a = torch.zeros(4, dtype=torch.int8)
    try:
        torch.ops.etfuse.quantized_decomposed_add.out(a, 0.1, 200, -128, 127, a, 0.1, 0, -128, 127, 0.1, 0, -128,
                                                      127, out=torch.empty(0, dtype=torch.int8))
        raise AssertionError("the C++ kernel accepted a zero point outside the range")
    except RuntimeError as e:
        assert "a_zero_point 200 is outside the quant range [-128, 127]" in str(e), str(e)
    if os.environ.get("ETFUSE_TRITON_DUMP"):
        torch.save(dump, os.path.join(os.environ["ETFUSE_TRITON_DUMP"], "cpp.pt"))
    return f"{len(dump)} outputs"


# ---- ptx (child process) -----------------------------------------------------------------

# One specialisation per kernel family and dtype (the full cross product is
# `python -m etfuse.kernels.triton.ptx`, ~40 s on 2 cores).
PTX_CASES = [
    "add_relu[float32,contig]", "add_relu[float16,bcast]", "add_relu[bfloat16,contig]",
    "quantized_add[int8,contig]", "quantized_add_relu[uint8,bcast]",
    "addmm_relu[float16,tf32,128x256x64,linear,bias,evenK]", "addmm_relu[bfloat16,tf32,128x128x64,addmm,bias,maskK]",
    "addmm_relu[float32,ieee,128x128x32,linear,nobias,maskK]",
    "embedding_byte[int8->float32,int64,zp]", "embedding_byte[uint8->float16,int32,nozp]",
]


def _run_ptx(names):
    from etfuse.kernels.triton import ptx
    specs = {s[0]: s for s in ptx.specs()}
    results = {}
    for name in names:
        t = time.time()
        try:
            _, k, sig, cx, opts, attrs = specs[name]
            c = ptx.compile_one(k, sig, cx, opts, attrs, arch=90)
            text = c.asm["ptx"]
            assert ".target sm_90" in text, "not an sm_90 target"
            assert len(c.asm.get("cubin", b"")) > 0, "no cubin"
            if name.startswith("quantized"):
                assert "fma" not in text, "FMA contraction in a quantized kernel"
                assert text.upper().count("4B400000") >= 1 and text.upper().count("CB400000") >= 1, \
                    "round-half-to-even adds were folded away"
            if "contig" in name or name.startswith("embedding"):  # memory-bound: 16-byte accesses
                assert "ld.global.v4" in text or "st.global.v4" in text, "no 128-bit global accesses"
            if name.startswith("addmm_relu[float16"):
                assert "wgmma" in text, "no sm_90 wgmma in the float16 matmul"
                assert "cp.async" in text, "the float16 matmul does not stage tiles with async copies"
            results[name] = {"ok": True, "info": f"{time.time() - t:.1f}s, ptx {len(text)} chars"}
        except Exception:  # noqa: BLE001
            results[name] = {"ok": False, "info": traceback.format_exc()[-3000:]}
    return results


def _run_cases(table):
    results = {}
    for name, fn in table.items():
        t = time.time()
        try:
            info = fn()
            results[name] = {"ok": True, "info": f"{time.time() - t:.1f}s" + (f": {info}" if info else "")}
        except Exception:  # noqa: BLE001
            results[name] = {"ok": False, "info": traceback.format_exc()[-3000:]}
    return results


def _child(mode: str) -> int:
    if mode == "interpret":
        assert os.environ.get("TRITON_INTERPRET") == "1"
        results = _run_cases(INTERPRET_CASES)
    elif mode == "register":
        _start_no_triton()
        cases = dict(REGISTER_CASES)
        cases["imports_and_reports_without_triton"] = cases.pop("imports_and_reports_without_triton")
        results = _run_cases(cases)
    elif mode == "ptx":
        results = _run_ptx(PTX_CASES)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(MARK + json.dumps(results), flush=True)
    return 0


# ---- pytest side -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def child_results():
    """Start the three children at once (2 cores: the PTX compiles overlap the interpreter)."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed (pip install \"etfuse[triton]\")")
    procs = {}
    dump = tempfile.mkdtemp(prefix="etfuse-triton-")
    for mode in ("interpret", "ptx", "register"):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        env["ETFUSE_TRITON_DUMP"] = dump
        if mode == "ptx":  # compile for real: no kernel cache from an earlier run
            env["TRITON_CACHE_DIR"] = os.path.join(dump, "triton-cache")
        if mode == "interpret":
            env["TRITON_INTERPRET"] = "1"
        procs[mode] = subprocess.Popen([sys.executable, os.path.abspath(__file__), mode], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
    out = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        line = next((l for l in stdout.splitlines() if l.startswith(MARK)), None)
        out[mode] = json.loads(line[len(MARK):]) if line else {"__crash__": {"ok": False, "info": f"rc {p.returncode}\n{stderr[-4000:]}"}}
    out["dump"] = dump
    yield out
    shutil.rmtree(dump, ignore_errors=True)


def _check(results, mode, name):
    r = results[mode]
    if "__crash__" in r:
        pytest.fail(f"{mode} child crashed: {r['__crash__']['info']}")
    case = r[name]
    if not case["ok"]:
        pytest.fail(case["info"], pytrace=False)
    print(f"{name}: {case['info']}")


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpreter(child_results, name):
    _check(child_results, "interpret", name)


@pytest.mark.parametrize("name", PTX_CASES)
def test_compiles_for_sm90(child_results, name):
    _check(child_results, "ptx", name)


@pytest.mark.parametrize("name", list(REGISTER_CASES))
def test_registration(child_results, name):
    _check(child_results, "register", name)


def test_quantized_bit_exact_with_cpp(child_results):
    """Triton (interpreter) and C++ outputs of quantized add / add_relu over every input pair."""
    import torch
    _check(child_results, "interpret", "quantized_add_and_add_relu_bit_exact")
    _check(child_results, "register", "cpp_kernels_reference_outputs")
    cpp_path = os.path.join(child_results["dump"], "cpp.pt")
    if not os.path.exists(cpp_path):
        pytest.skip("the C++ kernels are not built in this environment")
    triton_out = torch.load(os.path.join(child_results["dump"], "triton.pt"))
    cpp_out = torch.load(cpp_path)
    assert triton_out.keys() == cpp_out.keys() and len(cpp_out) == 16
    for key in cpp_out:
        assert torch.equal(triton_out[key], cpp_out[key]), key


def test_import_without_triton_in_this_process():
    """This process imported etfuse without importing triton (the registrations are not
    made here; `register_if_available` does nothing without a CUDA device)."""
    import etfuse.kernels.triton as kt
    assert kt.register_if_available() is False
    assert not kt.is_registered()


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
