"""kernels/ (etfuse.kernels): loading and building the libraries, the add_relu / linear_relu /
addmm_relu `.out` kernels in torch eager and in the ExecuTorch runtime, the narrower ISAs, the
cores through the probe library, and the op lists derived from the catalog. (Every kernel
against its pattern in every layout: test_out_kernels.py.)"""

import dataclasses
import importlib
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import etfuse.backend_ops as bo
import etfuse.kernels as kernels
from etfuse.kernels import build as kbuild

ops = torch.ops.etfuse
GEMM_TOL = dict(rtol=1e-4, atol=1e-4)

pytestmark = pytest.mark.usefixtures("eager_kernels")


# --------------------------------------------------------------------------------------------
# loading and building


def test_load_is_idempotent(eager_kernels):
    loaded = eager_kernels
    assert kernels.is_loaded()
    assert kernels.load() is loaded and kernels.load(eager=True) is loaded
    assert loaded.eager_library.is_file() and loaded.runtime_library.is_file()
    assert loaded.cache_dir.name == kbuild.cache_key()
    assert loaded.isa in ("avx512vnni", "avx512", "avx2", "baseline")
    assert loaded.runtime_threads >= 1


def test_out_ops_have_cpu_kernels_and_functional_ops_keep_their_pattern():
    for op in bo.FLOAT_OPS:
        out = f"{op.qualname.split('.')[0]}.out"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(out, "CPU"), out
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.qualname, "CPU"), op.qualname
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.qualname, "CompositeImplicitAutograd")
    from executorch.extension.pybindings import portable_lib

    names = set(portable_lib._get_operator_names())
    assert set(kernels.RUNTIME_OPS) <= names


FAKE_CXX = """#!{python}
import sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("fake-c++ 1.0"); sys.exit(0)
if "{mode}" == "fail":
    print("kernels.cpp:1:1: error: boom from the fake compiler"); sys.exit(1)
time.sleep(0.2)
out = args[args.index("-o") + 1]
open(out, "w").write("not really a library")
"""


def _fake_cxx(tmp_path, mode):
    p = tmp_path / f"fake-cxx-{mode}"
    p.write_text(FAKE_CXX.format(python=sys.executable, mode=mode))
    p.chmod(0o755)
    return str(p)


def test_build_is_cached_and_concurrent_builds_are_safe(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", _fake_cxx(tmp_path, "ok"))
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(tmp_path / "cache"))
    results, errors = [], []

    def run():
        try:
            results.append(kernels.cache.build())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({r.directory for r in results}) == 1
    final = results[0].directory
    assert final.parent == tmp_path / "cache" and final.name == results[0].key
    # no temp dirs left (the build lock's file may stay)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")) == [final.name]
    again = kernels.cache.build()
    assert again.directory == final and not again.built


def test_build_failure_shows_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", _fake_cxx(tmp_path, "fail"))
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(kernels.KernelBuildError, match="boom from the fake compiler"):
        kernels.cache.build()
    assert [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


LOGGING_CXX = """#!{python}
import sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
with open({log!r}, "a") as f:
    f.write(out + "\\n")
open(out, "w").close()
"""


def test_reinstalled_sources_recompile_only_what_changed(tmp_path, monkeypatch):
    """pip writes every file anew when etfuse is reinstalled: the build directory compiles a copy
    of the sources that keeps the times of unchanged files, so ninja rebuilds nothing then, and
    only an edited op file's two translation units (and the links) after an edit."""
    import os
    import shutil

    csrc = tmp_path / "csrc"
    shutil.copytree(kbuild.CSRC, csrc)
    monkeypatch.setattr(kbuild, "CSRC", csrc)
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "logging-cxx"
    cxx.write_text(LOGGING_CXX.format(python=sys.executable, log=str(log)))
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    build_dir = tmp_path / "build"

    def ninja():
        log.write_text("")
        kbuild._run_ninja(build_dir, kbuild.library_sources(), kbuild.LIBRARIES, clean=False, verbose=False)
        return sorted(log.read_text().split())

    first = ninja()
    assert "core/kernels.o" in first and set(kbuild.LIBRARIES) <= set(first)
    later = os.stat(csrc / "core" / "kernels.cpp").st_mtime + 60
    for p in csrc.rglob("*"):  # a reinstall: the same bytes, every file newer
        if p.is_file():
            p.write_bytes(p.read_bytes())
            os.utime(p, (later, later))
    assert ninja() == []
    with open(csrc / "ops" / "add_relu.cpp", "a") as f:
        f.write("\n// edited\n")
    relinked = [lib for lib, srcs in kbuild.library_sources().items() if "ops/add_relu.cpp" in srcs]
    assert ninja() == sorted(["eager/ops/add_relu.o", "runtime/ops/add_relu.o", *relinked])


def test_package_data_ships_every_kernel_source():
    """The wheel ships every header and source under csrc/ (pyproject's package-data globs, which
    do not recurse): a new folder, such as csrc/core/conv2d/, must be named there, or the installed
    package, its CMake package and the kernel build miss its files."""
    import tomllib

    repo = Path(__file__).resolve().parents[1]  # the checkout's, also where CI installs a copy from
    globs = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["etfuse.kernels"]
    package = repo / "kernels"
    shipped = {p for pattern in globs for p in package.glob(pattern)}
    sources = sorted(p for p in (package / "csrc").rglob("*") if p.suffix in (".h", ".cpp"))
    assert sources and [str(p.relative_to(package)) for p in sources if p not in shipped] == []


# --------------------------------------------------------------------------------------------
# eager: add_relu


def _add_relu(a, b, out=None):
    out = torch.empty(0) if out is None else out
    return ops.add_relu.out(a, b, out=out)


@pytest.mark.parametrize("n", [1, 3, 17, 257, 1000, 200_003])
def test_add_relu_same_shape(kernel_check, n):
    a, b = torch.randn(n), torch.randn(n)
    kernel_check.eager(bo.ADD_RELU, (a, b), tol=dict(rtol=0, atol=0))


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((4, 17), (17,)),
        ((4, 17), (4, 1)),
        ((4, 1, 5), (3, 1)),
        ((), (7,)),
        ((7,), ()),
        ((1,), (5, 3)),
        ((2, 3, 4), (1, 3, 1)),
        ((3, 1, 257), (1, 5, 1)),
        ((300, 1025), (1025,)),  # parallel path, chunks start mid-row
        ((300, 1025), (300, 1)),
        ((1, 300, 1), (7, 1, 1025)),
        ((), ()),
        ((0, 3), (3,)),
    ],
)
def test_add_relu_broadcast(kernel_check, sa, sb):
    a, b = torch.randn(sa), torch.randn(sb)
    kernel_check.eager(bo.ADD_RELU, (a, b), tol=dict(rtol=0, atol=0))
    kernel_check.eager(bo.ADD_RELU, (b, a), tol=dict(rtol=0, atol=0))


def test_add_relu_strided_inputs_and_out():
    a = torch.randn(33, 65).t()  # non-contiguous
    b = torch.randn(65, 1).expand(65, 33)  # zero strides
    out = torch.empty(33, 65).t()  # non-contiguous out keeps its strides
    res = _add_relu(a, b, out)
    assert res is out and out.stride() == (1, 65)
    assert_close(out, bo.ADD_RELU.pattern(a, b), rtol=0, atol=0)


def test_add_relu_out_resized_reused_and_inplace():
    a, b = torch.randn(6, 7), torch.randn(7)
    out = torch.empty(6, 7)
    ptr = out.data_ptr()
    _add_relu(a, b, out)
    assert out.data_ptr() == ptr
    expected = bo.ADD_RELU.pattern(a, b)
    assert_close(_add_relu(a, b, torch.empty(3)), expected, rtol=0, atol=0)
    ops.add_relu.out(a, b, out=a)  # out aliases self exactly: allowed, like aten
    assert_close(a, expected, rtol=0, atol=0)


def test_add_relu_nan_and_signs():
    a = torch.tensor([float("nan"), -1.0, 1.0, -0.0, float("-inf"), float("inf")])
    b = torch.tensor([1.0, 0.5, -2.0, 0.0, 1.0, -1.0])
    assert_close(_add_relu(a, b), torch.relu(a + b), rtol=0, atol=0, equal_nan=True)


# --------------------------------------------------------------------------------------------
# eager: linear_relu and addmm_relu

GEMM_SIZES = [(1, 1, 1), (3, 17, 5), (17, 3, 257), (5, 257, 33), (200, 600, 19), (64, 256, 256)]


@pytest.mark.parametrize("m,k,n", GEMM_SIZES)
@pytest.mark.parametrize("bias", ["vector", "none", "scalar"])
def test_linear_relu(m, k, n, bias):
    x, w = torch.randn(m, k), torch.randn(n, k)
    b = {"vector": torch.randn(n), "none": None, "scalar": torch.randn(1)}[bias]
    got = ops.linear_relu.out(x, w, b, out=torch.empty(0))
    assert_close(got, bo.LINEAR_RELU.pattern(x, w, b), **GEMM_TOL)


def test_linear_relu_batched_vector_and_strided():
    w, b = torch.randn(9, 13), torch.randn(9)
    for x in (torch.randn(2, 5, 13), torch.randn(13), torch.randn(13, 6).t(), torch.randn(2, 13, 5).transpose(1, 2)):
        assert_close(ops.linear_relu.out(x, w, b, out=torch.empty(0)), bo.LINEAR_RELU.pattern(x, w, b), **GEMM_TOL)
    wt = torch.randn(13, 9).t()  # weight not contiguous
    x = torch.randn(4, 13)
    assert_close(ops.linear_relu.out(x, wt, b, out=torch.empty(0)), bo.LINEAR_RELU.pattern(x, wt, b), **GEMM_TOL)
    out = torch.empty(9, 4).t()  # strided out
    ops.linear_relu.out(x, wt, b, out=out)
    assert_close(out, bo.LINEAR_RELU.pattern(x, wt, b), **GEMM_TOL)


@pytest.mark.parametrize("m,k,n", GEMM_SIZES)
@pytest.mark.parametrize("self_shape", ["n", "1n", "m1", "mn", "scalar", "one"])
def test_addmm_relu(m, k, n, self_shape):
    s = torch.randn({"n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n), "scalar": (), "one": (1,)}[self_shape])
    m1, m2 = torch.randn(m, k), torch.randn(k, n)
    got = ops.addmm_relu.out(s, m1, m2, out=torch.empty(0))
    assert_close(got, bo.ADDMM_RELU.pattern(s, m1, m2), **GEMM_TOL)


def test_addmm_relu_strided_and_aliased():
    s, m1, m2 = torch.randn(7), torch.randn(11, 5).t(), torch.randn(7, 11).t()
    assert_close(ops.addmm_relu.out(s, m1, m2, out=torch.empty(0)), bo.ADDMM_RELU.pattern(s, m1, m2), **GEMM_TOL)
    sq = torch.randn(8, 8)
    expected = bo.ADDMM_RELU.pattern(sq, sq, sq)
    ops.addmm_relu.out(sq, sq, sq, out=sq)  # out aliases every input: computed into a temporary
    assert_close(sq, expected, **GEMM_TOL)


def test_zero_sized_gemms():
    assert ops.linear_relu.out(torch.randn(0, 4), torch.randn(3, 4), None, out=torch.empty(0)).shape == (0, 3)
    s = torch.randn(3)
    assert_close(ops.addmm_relu.out(s, torch.randn(2, 0), torch.randn(0, 3), out=torch.empty(0)), torch.relu(s).expand(2, 3))
    s = torch.randn(2, 3)
    assert_close(ops.addmm_relu.out(s, torch.randn(2, 0), torch.randn(0, 3), out=torch.empty(0)), torch.relu(s))


# --------------------------------------------------------------------------------------------
# eager: errors are exceptions, never aborts


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: _add_relu(torch.randn(3, dtype=torch.float64), torch.randn(3)), "float32"),
        (lambda: _add_relu(torch.randn(3), torch.randn(3), torch.empty(3, dtype=torch.int32)), "float32"),
        (lambda: _add_relu(torch.randn(3), torch.randn(4)), "broadcast"),
        (lambda: ops.linear_relu.out(torch.randn(2, 3), torch.randn(4, 5), None, out=torch.empty(0)), "in_features"),
        (lambda: ops.linear_relu.out(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5), out=torch.empty(0)), "bias"),
        (lambda: ops.linear_relu.out(torch.randn(2, 3), torch.randn(4, 3, 1), None, out=torch.empty(0)), "2-D"),
        (lambda: ops.linear_relu.out(torch.randn(()), torch.randn(4, 3), None, out=torch.empty(0)), "0-d"),
        (lambda: ops.linear_relu.out(torch.randn(2, 3).half(), torch.randn(4, 3), None, out=torch.empty(0)), "float32"),
        (lambda: ops.addmm_relu.out(torch.randn(3), torch.randn(2, 4), torch.randn(5, 3), out=torch.empty(0)), "multiplied"),
        (lambda: ops.addmm_relu.out(torch.randn(4), torch.randn(2, 4), torch.randn(4, 3), out=torch.empty(0)), "broadcast"),
        (lambda: ops.addmm_relu.out(torch.randn(3), torch.randn(2, 4, 1), torch.randn(4, 3), out=torch.empty(0)), "2-D"),
        (lambda: _add_relu(torch.randn(2, 3), torch.randn(3), torch.empty(1).expand(2, 3)), "single memory location"),
    ],
)
def test_eager_errors(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


# --------------------------------------------------------------------------------------------
# opcheck

def _req(*shape):
    return torch.randn(*shape, requires_grad=True)


def test_opcheck_out_ops(opcheck):
    samples = [
        (ops.add_relu.out, (_req(3, 4), _req(4)), (3, 4)),
        (ops.add_relu.out, (_req(5), _req(5)), (5,)),
        (ops.linear_relu.out, (_req(3, 8), _req(5, 8), _req(5)), (3, 5)),
        (ops.linear_relu.out, (_req(3, 8), _req(5, 8), None), (3, 5)),
        (ops.addmm_relu.out, (_req(5), _req(3, 8), _req(8, 5)), (3, 5)),
        (ops.addmm_relu.out, (_req(3, 1), _req(3, 8), _req(8, 5)), (3, 5)),
    ]
    for op, args, out_shape in samples:
        opcheck.out(op, args, torch.empty(out_shape))


def test_opcheck_functional_ops(opcheck):
    opcheck(ops.add_relu.default, (_req(3, 4), _req(4)))
    opcheck(ops.linear_relu.default, (_req(3, 8), _req(5, 8), _req(5)))
    opcheck(ops.linear_relu.default, (_req(3, 8), _req(5, 8)))
    opcheck(ops.addmm_relu.default, (_req(5), _req(3, 8), _req(8, 5)))


# --------------------------------------------------------------------------------------------
# the SSE2 baseline copy of the dispatched loops (the default on CPUs without AVX2), reloading


def _forced_isa(name):
    kernels.set_isa(name)
    isas = kernels.current_isa()
    assert isas["eager"] == isas["runtime"] == name and set(isas.values()) == {name}, isas


@pytest.fixture
def baseline_isa():
    _forced_isa("baseline")
    yield
    kernels.set_isa("auto")
    assert kernels.current_isa()["eager"] == kernels.info().isa


# The default ISA is exercised by every other test; these force the narrower copies.
@pytest.fixture(params=["baseline", "avx2"])
def narrower_isa(request, eager_kernels):
    if request.param == "avx2" and eager_kernels.isa not in ("avx512", "avx512vnni"):
        pytest.skip("the AVX2 GEMM is the default one on this CPU")
    _forced_isa(request.param)
    yield request.param
    kernels.set_isa("auto")
    assert kernels.current_isa()["eager"] == kernels.info().isa


def test_set_isa_rejects_unknown_names():
    with pytest.raises(ValueError):
        kernels.set_isa("avx9000")


@pytest.mark.parametrize("m,k,n", [(7, 300, 21), (100, 64, 40), (1, 1, 1), (13, 600, 35)])
def test_narrower_isa_eager(narrower_isa, m, k, n):
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    assert_close(ops.linear_relu.out(x, w, b, out=torch.empty(0)), bo.LINEAR_RELU.pattern(x, w, b), **GEMM_TOL)
    s, m2 = torch.randn(m, 1), torch.randn(k, n)
    assert_close(ops.addmm_relu.out(s, x, m2, out=torch.empty(0)), bo.ADDMM_RELU.pattern(s, x, m2), **GEMM_TOL)
    a, c = torch.randn(300, 1025), torch.randn(1025)
    assert_close(_add_relu(a, c), bo.ADD_RELU.pattern(a, c), rtol=0, atol=0)


def test_reload_does_not_register_twice(eager_kernels):
    loaded = eager_kernels
    k2 = importlib.reload(kernels)  # fresh module state; the runtime would abort on a second registration
    try:
        again = k2.load(eager=True)
        assert again.runtime_library is None and again.eager_library == loaded.eager_library
    finally:
        k2._INFO = loaded


# --------------------------------------------------------------------------------------------
# ExecuTorch runtime


def _fuse_pass():
    """etfuse's own float fusions (relu(add), relu(linear), relu(addmm))."""
    from etfuse.passes import FloatFusionPass

    return FloatFusionPass()


def _program(model, args, tmp_path, name, dynamic_shapes=None):
    from executorch.exir import to_edge

    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    et = to_edge(ep).transform([_fuse_pass()]).to_executorch()
    op_names = {o.name + ("." + o.overload if o.overload else "") for o in et.executorch_program.execution_plan[0].operators}
    path = tmp_path / f"{name}.pte"
    path.write_bytes(et.buffer)
    return path, op_names


def _method(path):
    from executorch.runtime import Runtime

    return Runtime.get().load_program(str(path)).load_method("forward")


class _AddRelu(torch.nn.Module):
    def forward(self, a, b, c, d):
        return torch.relu(a + b), torch.relu(a + c), torch.relu(d + a)


def test_runtime_add_relu_broadcast(tmp_path):
    args = (torch.randn(4, 17), torch.randn(4, 17), torch.randn(17), torch.randn(4, 1))
    path, names = _program(_AddRelu(), args, tmp_path, "add_relu")
    assert names == {"etfuse::add_relu.out"}
    method = _method(path)
    for _ in range(2):
        args = tuple(torch.randn_like(t) for t in args)
        got = method.execute(list(args))
        for g, e in zip(got, _AddRelu()(*args)):
            assert_close(g, e, rtol=0, atol=0)
    # the runtime itself refuses an input of the wrong size; the process survives
    with pytest.raises(RuntimeError):
        method.execute([torch.randn(5, 17), *args[1:]])
    assert_close(method.execute(list(args))[0], torch.relu(args[0] + args[1]), rtol=0, atol=0)


class _Relu2(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)


def test_runtime_add_relu_dynamic_shapes_and_kernel_errors(tmp_path):
    from torch.export import Dim

    n = Dim("n", max=1 << 20)
    args = (torch.randn(8, 16), torch.randn(8, 16))
    path, names = _program(_Relu2(), args, tmp_path, "dyn", dynamic_shapes=({0: n}, {0: n}))
    assert names == {"etfuse::add_relu.out"}
    method = _method(path)
    for rows in (1, 3, 17, 40_000):  # out is planned at the upper bound and resized by the kernel
        a, b = torch.randn(rows, 16), torch.randn(rows, 16)
        (got,) = method.execute([a, b])
        assert got.shape == (rows, 16)
        assert_close(got, torch.relu(a + b), rtol=0, atol=0)
    # both inputs are resized independently; the kernel rejects shapes that do not broadcast
    with pytest.raises(RuntimeError):
        method.execute([torch.randn(5, 16), torch.randn(6, 16)])
    a, b = torch.randn(2, 16), torch.randn(2, 16)
    assert_close(method.execute([a, b])[0], torch.relu(a + b), rtol=0, atol=0)


class _Gemms(torch.nn.Module):
    def __init__(self, k=37, n=19):
        super().__init__()
        self.lin = torch.nn.Linear(k, n)
        self.lin_nobias = torch.nn.Linear(k, n, bias=False)

    def forward(self, x, s, m1, m2):
        return torch.relu(self.lin(x)), torch.relu(self.lin_nobias(x)), torch.relu(torch.addmm(s, m1, m2))


@pytest.mark.parametrize("m,k,n,isa", [(3, 37, 19, "auto"), (64, 256, 256, "auto"), (50, 70, 30, "baseline")])
def test_runtime_linear_and_addmm(tmp_path, m, k, n, isa, request):
    if isa == "baseline":
        request.getfixturevalue("baseline_isa")
    model = _Gemms(k, n).eval()
    args = (torch.randn(m, k), torch.randn(1, n), torch.randn(m, k), torch.randn(k, n))
    path, names = _program(model, args, tmp_path, f"gemm{m}")
    assert names == {"etfuse::linear_relu.out", "etfuse::addmm_relu.out"}
    method = _method(path)
    args = tuple(torch.randn_like(t) for t in args)
    with torch.no_grad():
        expected = model(*args)
    for g, e in zip(method.execute(list(args)), expected):
        assert_close(g, e, **GEMM_TOL)


# --------------------------------------------------------------------------------------------
# the cores through the test-only library (etfuse.kernels.build.probe_library): the broadcast
# plan shared with the Triton launcher, the GEMM / conv2d scale epilogue


@pytest.fixture(scope="module")
def probe_lib():
    import ctypes

    lib = ctypes.CDLL(str(kbuild.probe_library()))
    i64p = ctypes.POINTER(ctypes.c_int64)
    lib.etfuse_probe_broadcast_plan.restype = ctypes.c_int
    lib.etfuse_probe_broadcast_plan.argtypes = [ctypes.c_int, i64p, ctypes.c_int, i64p, i64p, ctypes.c_int, i64p, i64p,
                                                i64p, i64p, i64p, i64p]
    f = ctypes.c_float
    vp = ctypes.c_void_p
    lib.etfuse_probe_gemm.argtypes = [ctypes.c_int64] * 3 + [vp] * 4 + [f, f, vp]
    lib.etfuse_probe_conv2d.restype = ctypes.c_int
    lib.etfuse_probe_conv2d.argtypes = [i64p, vp, i64p, vp, vp, vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, f, f, vp]
    return lib


def _i64(values):
    import ctypes

    return (ctypes.c_int64 * max(1, len(values)))(*values)


def _cpp_plan(lib, shape, a, b):
    """The C++ plan in the Python launcher's form: sizes outermost first padded to 4 dims, strides per operand."""
    import ctypes

    out = [(ctypes.c_int64 * 16)() for _ in range(4)]
    n = lib.etfuse_probe_broadcast_plan(len(shape), _i64(shape), a.dim(), _i64(a.shape), _i64(a.stride()), b.dim(),
                                        _i64(b.shape), _i64(b.stride()), *out)
    dims = [(out[0][d], out[1][d], out[2][d]) for d in range(n) if out[0][d] != 1]
    dims += [(1, 0, 0)] * (4 - len(dims))
    dims.reverse()
    return [d[0] for d in dims], [[d[1] for d in dims], [d[2] for d in dims]]


PLAN_CASES = [
    ((5,), (5,)), ((3, 4), (4,)), ((3, 4), (3, 1)), ((2, 3, 4), (1, 3, 1)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)),
    ((2, 3, 4, 5), (5,)), ((6, 1, 7), (1, 5, 1)), ((), (3,)), ((4, 4), ()),
]


@pytest.mark.parametrize("sa,sb", PLAN_CASES)
def test_broadcast_plan_is_the_triton_launchers(probe_lib, sa, sb):
    launch = pytest.importorskip("etfuse.kernels.triton.launch")
    for a, b in ((torch.randn(sa), torch.randn(sb)), (torch.randn(*reversed(sa)).t() if len(sa) == 2 else torch.randn(sa), torch.randn(sb))):
        shape = torch.broadcast_shapes(a.shape, b.shape)
        sizes, strides, _ = launch.broadcast_plan(shape, (a, b))
        assert _cpp_plan(probe_lib, list(shape), a, b) == (sizes, strides), (sa, sb, a.stride())


@pytest.mark.parametrize("m,k,n", [(1, 9, 7), (3, 300, 21), (100, 64, 40)])
def test_gemm_scale_epilogue(probe_lib, m, k, n):
    a, b, s, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n), torch.randn(n)
    c = torch.empty(m, n)
    probe_lib.etfuse_probe_gemm(m, n, k, a.data_ptr(), b.data_ptr(), s.data_ptr(), bias.data_ptr(), -0.5, 2.0, c.data_ptr())
    assert_close(c, torch.clamp((a @ b) * s + bias, -0.5, 2.0), **GEMM_TOL)
    probe_lib.etfuse_probe_gemm(m, n, k, a.data_ptr(), b.data_ptr(), s.data_ptr(), None, -1e30, 1e30, c.data_ptr())
    assert_close(c, (a @ b) * s, **GEMM_TOL)


@pytest.mark.parametrize("c_in,c_out,groups,stride,padding", [(3, 8, 1, 1, 1), (8, 8, 8, 1, 1), (8, 16, 8, 2, 0),
                                                               (4, 6, 2, 1, 0), (16, 16, 16, 2, 1)])
def test_conv2d_scale_epilogue(probe_lib, c_in, c_out, groups, stride, padding):
    x, w = torch.randn(2, c_in, 9, 11), torch.randn(c_out, c_in // groups, 3, 3)
    s, bias = torch.randn(c_out), torch.randn(c_out)
    ref = torch.nn.functional.conv2d(x, w, None, stride, padding, 1, groups) * s[:, None, None] + bias[:, None, None]
    out = torch.empty(ref.shape)
    assert probe_lib.etfuse_probe_conv2d(_i64(x.shape), x.data_ptr(), _i64(w.shape), w.data_ptr(), s.data_ptr(),
                                         bias.data_ptr(), stride, padding, groups, -1.0, 1.5, out.data_ptr()) == 0
    assert_close(out, ref.clamp(-1.0, 1.5), **GEMM_TOL)


# --------------------------------------------------------------------------------------------
# the out contract (adapter.h): the same in eager and in the runtime


def test_out_whose_strides_the_core_cannot_write_goes_through_a_temporary():
    """An `out` whose strides the core cannot write (a conv output plane with gaps between rows,
    a strided quantize target) is computed into a temporary and copied. The decision is
    adapter.h's `Out`, compiled into both the eager and the runtime kernels (before, the runtime
    kernels failed on such an out); a .pte only hands the runtime contiguous outs, so this
    checks the eager build of that code."""
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    ref = ops.conv2d_act(x, w, b, [1, 1], [1, 1], [1, 1], 1, 0.0, None)
    base = torch.zeros(2, 4, 8, 16)
    out = base[..., ::2]  # rows of the output plane are not evenly strided
    got = ops.conv2d_act.out(x, w, b, [1, 1], [1, 1], [1, 1], 1, 0.0, None, out=out)
    assert got is out and out.stride() == (512, 128, 16, 2)
    assert_close(out, ref, **GEMM_TOL)
    assert base[..., 1::2].abs().sum() == 0  # nothing written between the strided elements
    # quantize into a non-contiguous out: eager copies through a temporary as well
    q = torch.empty(8, 6, dtype=torch.int8).t()
    torch.ops.etfuse.quantized_decomposed_quantize_per_tensor.out(torch.randn(6, 8), 0.05, 0, -128, 127, torch.int8, out=q)
    assert q.stride() == (1, 6)


# --------------------------------------------------------------------------------------------
# op lists and build sources come from the catalog


def test_op_lists_and_sources_are_derived_from_the_catalog():
    records = kbuild.kernel_ops()
    assert {op.qualname for op in records} >= {bo.runtime_op(op).qualname for op in (*bo.FLOAT_OPS, *bo.GEMM_CONV_OPS, *bo.QUANTIZED_OPS)}
    assert set(kernels.EAGER_OPS) == {f"{op.namespace}::{op.out_name}" for op in records}
    assert set(kernels.RUNTIME_OPS) == {f"{op.namespace}::{op.out_name}" for op in records} | {
        "etfuse::update_cache_"}  # the in-place forms too
    # every runtime name is etfuse's but executorch's packing op: none that the stock quantized kernels register
    assert {n.split("::")[0] for n in kernels.RUNTIME_OPS} == {"etfuse", "quant_fusion"}
    assert {n for n in kernels.RUNTIME_OPS if "quantized_decomposed" in n} == {
        "etfuse::quantized_decomposed_add.out", "etfuse::quantized_decomposed_add_relu.out",
        "etfuse::quantized_decomposed_add.scalar_out",
        "etfuse::quantized_decomposed_embedding_byte.out", "etfuse::quantized_decomposed_embedding_byte.dtype_out",
        "etfuse::quantized_decomposed_embedding_4bit.out", "etfuse::quantized_decomposed_embedding_4bit.dtype_out",
        "etfuse::quantized_decomposed_embedding_2bit.out", "etfuse::quantized_decomposed_embedding_2bit.dtype_out",
        "etfuse::quantized_decomposed_quantize_per_tensor.out", "etfuse::quantized_decomposed_dequantize_per_tensor.out",
        "etfuse::quantized_decomposed_dequantize_per_channel.out"}
    libs = kbuild.library_sources()
    files = sorted(f"ops/{p.name}" for p in (kbuild.CSRC / "ops").glob("*.cpp"))
    assert libs[kbuild.EAGER_LIB] == files
    assert libs[kbuild.RUNTIME_LIB] == files


def test_a_kernel_file_without_a_record_is_a_build_error(monkeypatch):
    records = [op for op in kbuild.kernel_ops() if op.kernel != "add_relu"]
    monkeypatch.setattr(kbuild, "kernel_ops", lambda: records)
    with pytest.raises(kernels.KernelBuildError, match=r"kernel files without a catalog record: \['ops/add_relu.cpp'\]"):
        kbuild.library_sources()
    monkeypatch.setattr(kbuild, "kernel_ops", lambda: [*records, dataclasses.replace(bo.ADD_RELU, kernel="nowhere")])
    with pytest.raises(kernels.KernelBuildError, match=r"catalog records naming missing kernel files: \['ops/nowhere.cpp'\]"):
        kbuild.library_sources()
