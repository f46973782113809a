"""etfuse C++ kernels for the etfuse backend ops (`etfuse::add_relu.out`, ...).

`load()` builds the kernels once (ninja, `build.py`; cached, `cache.py`: each library is checked
against the cache entry's manifest before it is mapped, and a damaged entry is rebuilt) and
registers them:

* in the ExecuTorch runtime, so programs holding `etfuse::*.out` ops run through
  `executorch.runtime` (libetfuse_runtime.so, always);
* with `load(eager=True)`, also in torch, as the CPU kernels of the `.out` variants
  (`torch.ops.etfuse.add_relu.out` then runs compiled code instead of the Python reference
  kernel; libetfuse_eager.so). Fusing, lowering and running programs never call them, so the
  first run does not wait for that library's build (its units compile against the torch headers).

The functional ops keep their pattern (CompositeImplicitAutograd) kernels on purpose.
`load()` is idempotent within a process: the ExecuTorch runtime aborts the process when an op
is registered twice, so a second call returns the first call's result (adding the eager library
when it asks for it).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from pathlib import Path
from typing import Optional

from . import build as build  # the module: build.build(), build.cache_key(), ...
from . import cache as cache
from .build import EAGER_LIB, RUNTIME_LIB, KernelBuildError, KernelCacheWarning
from .cache import cache_root
from .cmake_package import CMAKE_DIR
from etfuse.quiet import without_runtime_start_lines

__all__ = ["KernelInfo", "KernelBuildError", "KernelCacheWarning", "load", "prepare", "is_loaded", "info", "build", "cache_root", "set_isa", "current_isa", "RUNTIME_OPS", "cmake_prefix_path"]

# The CMake package (etfuse-config.cmake: the target etfuse::kernels), like
# torch.utils.cmake_prefix_path: -DCMAKE_PREFIX_PATH="<this>;<executorch>/share/cmake".
cmake_prefix_path: str = str(CMAKE_DIR)

# The op lists are derived from the catalog's kernel metadata (BackendOp.kernel), computed on
# first use so that importing etfuse.kernels imports no torch:
#   RUNTIME_OPS  `.out` ops (and in-place forms, `BackendOp.inplace`) registered by
#                libetfuse_runtime.so: all `etfuse::` (quantized_decomposed ops as their twins,
#                backend_ops/runtime_names.py) but executorch's `quant_fusion::_pack_embedding_weight.out`
#   EAGER_OPS    `.out` ops with a CPU kernel in libetfuse_eager.so (the same ops)
_DERIVED = ("RUNTIME_OPS", "EAGER_OPS")


def _op_lists() -> dict:
    ops = build.kernel_ops()
    out_name = lambda op: f"{op.namespace}::{op.out_name}"  # noqa: E731
    return {
        "RUNTIME_OPS": tuple(out_name(op) for op in ops) + tuple(f"{op.namespace}::{op.inplace_name}" for op in ops if op.inplace),
        "EAGER_OPS": tuple(out_name(op) for op in ops),
    }


def _ensure_op_lists() -> None:
    if "RUNTIME_OPS" not in globals():
        globals().update(_op_lists())


def __getattr__(name: str):
    if name in _DERIVED:
        _ensure_op_lists()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    eager_library: Optional[Path]  # None until `load(eager=True)`
    runtime_library: Optional[Path]  # None when the runtime ops were already registered elsewhere
    cache_dir: Path
    built: bool  # compiled by this process (False: found in the cache)
    isa: str  # what the dispatched loops picked at load: "avx512" (AVX-512 GEMM), "avx2" or "baseline"
    runtime_threads: int
    runtime: Optional[ctypes.CDLL] = dataclasses.field(default=None, repr=False, compare=False)
    eager: Optional[ctypes.CDLL] = dataclasses.field(default=None, repr=False, compare=False)


_LOCK = threading.RLock()
_INFO: Optional[KernelInfo] = None
_PREPARING: Optional[threading.Thread] = None


def prepare() -> None:
    """Start building (or finding) the runtime library in a background thread and return at once:
    a caller that will `load()` later (the CLI, `etfuse.compare`) overlaps the compile (ninja, in
    other processes) with its own export and fusion. `load()` waits for it; a build error is
    raised there."""
    global _PREPARING
    with _LOCK:
        if _INFO is None and _PREPARING is None:
            def build_runtime():
                try:
                    cache.build(libraries=(RUNTIME_LIB,))
                except Exception:  # noqa: BLE001 - load() builds again and raises it with its context
                    pass

            _PREPARING = threading.Thread(target=build_runtime, name="etfuse-kernels-build", daemon=True)
            _PREPARING.start()


def _runtime_registered() -> set[str]:
    """The ops of libetfuse_runtime.so the runtime has (not all are `etfuse::`: executorch's
    `quant_fusion::_pack_embedding_weight.out` is there too)."""
    from executorch.extension.pybindings import portable_lib

    _ensure_op_lists()
    return set(portable_lib._get_operator_names()) & set(RUNTIME_OPS)


def load(verbose: bool = False, eager: bool = False) -> KernelInfo:
    """Build (or find cached) and register the runtime kernels, and with `eager=True` the torch
    CPU kernels of the `.out` ops too; returns where they came from."""
    global _INFO
    if _PREPARING is not None:
        _PREPARING.join()
    with _LOCK:
        if _INFO is None:
            _INFO = _load_runtime(verbose)
        if eager and _INFO.eager is None:
            _INFO = _load_eager(_INFO, verbose)
        return _INFO


def _load_runtime(verbose: bool) -> KernelInfo:
    import etfuse.backend_ops

    etfuse.backend_ops.install()  # schemas must exist before the libraries register kernels
    from executorch.extension.pybindings import portable_lib  # noqa: F401  (loads libexecutorch.so)

    _ensure_op_lists()
    already = _runtime_registered()
    if already and not set(RUNTIME_OPS) <= already:
        raise RuntimeError(
            f"some etfuse runtime ops are registered already ({sorted(already)}) but not all of "
            f"{list(RUNTIME_OPS)}; refusing to register them again (the runtime aborts on duplicates)"
        )
    res = cache.build(verbose=verbose, libraries=(RUNTIME_LIB,))
    runtime_lib = None
    if not already:
        runtime_lib = ctypes.CDLL(str(res.runtime), mode=os.RTLD_GLOBAL)
        runtime_lib.etfuse_runtime_isa.restype = ctypes.c_char_p
        runtime_lib.etfuse_runtime_set_isa.argtypes = [ctypes.c_char_p]
        runtime_lib.etfuse_runtime_thread_count.restype = ctypes.c_int64
        # starts the runtime's threadpool, which prints its CPU probe's misses once per process
        threads = without_runtime_start_lines(runtime_lib.etfuse_runtime_thread_count)
        missing = set(RUNTIME_OPS) - _runtime_registered()
        if missing:
            raise RuntimeError(f"{res.runtime} loaded but did not register {sorted(missing)}")
    return KernelInfo(
        eager_library=None,
        runtime_library=res.runtime if runtime_lib is not None else None,
        cache_dir=res.directory,
        built=res.built,
        isa=runtime_lib.etfuse_runtime_isa().decode() if runtime_lib is not None else "unknown",
        runtime_threads=int(threads) if runtime_lib is not None else 0,
        runtime=runtime_lib,
    )


def _load_eager(info: KernelInfo, verbose: bool) -> KernelInfo:
    import torch

    res = cache.build(verbose=verbose, libraries=(EAGER_LIB,))
    if not all(torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU") for op in EAGER_OPS):
        torch.ops.load_library(str(res.eager))
    # Already loaded by torch: dlopen hands back the same library, for its C entry points.
    eager_lib = ctypes.CDLL(str(res.eager))
    eager_lib.etfuse_eager_isa.restype = ctypes.c_char_p
    eager_lib.etfuse_eager_set_isa.argtypes = [ctypes.c_char_p]
    return dataclasses.replace(info, eager_library=res.eager, built=info.built or res.built,
                               isa=eager_lib.etfuse_eager_isa().decode(), eager=eager_lib)


def is_loaded() -> bool:
    return _INFO is not None


def info() -> Optional[KernelInfo]:
    return _INFO


def set_isa(name: str = "auto") -> None:
    """Force every library's kernels onto one ISA this CPU has: "baseline" (portable), on x86-64
    "avx2", "avx512" or "avx512vnni", on aarch64 "neon" or "neondot" (dot products); or back to
    "auto", the best the CPU has (csrc/core/isa.h; the environment variable ETFUSE_KERNELS_ISA
    takes the same names at load).
    For tests and benchmarks: do not call while kernels run on other threads."""
    info = load()
    for lib, fn in ((info.eager, "etfuse_eager_set_isa"), (info.runtime, "etfuse_runtime_set_isa")):
        if lib is not None and not getattr(lib, fn)(name.encode()):
            raise ValueError(f"unknown ISA {name!r} or not supported by this CPU (use 'auto', 'baseline', "
                             "'avx2', 'avx512', 'avx512vnni', 'neon' or 'neondot')")


def current_isa() -> dict:
    """The ISA each loaded library currently uses."""
    info = load()
    out = {}
    if info.eager is not None:
        out["eager"] = info.eager.etfuse_eager_isa().decode()
    if info.runtime is not None:
        out["runtime"] = info.runtime.etfuse_runtime_isa().decode()
    return out
