"""Build the etfuse C++ kernels: one shared library for torch eager, one for the ExecuTorch runtime.

Both libraries compile the same kernel cores (`csrc/core/*.h`) through a thin registration
file each (`csrc/eager_ops.cpp`, `csrc/runtime_ops.cpp`). They are built with the system C++
compiler through subprocess (no ninja, no setuptools), once, into a cache directory keyed by
a hash of the sources, the compiler, the flags and the torch/executorch versions:

    $ETFUSE_KERNEL_CACHE/<key>/     (default ~/.cache/etfuse/kernels/<key>/)
        libetfuse_eager.so
        libetfuse_runtime.so

A build goes to a temporary directory next to the final one and is renamed into place, so
concurrent processes never see a half-written library (the loser of a race discards its copy).
Flags target the x86-64 baseline (no -march=native: the cache may be shared between machines);
the hot loops carry AVX2+FMA copies selected at runtime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional
from etfuse.errors import EtfuseError

CSRC = Path(__file__).resolve().parent / "csrc"
EAGER_LIB = "libetfuse_eager.so"
RUNTIME_LIB = "libetfuse_runtime.so"
# The quantized_decomposed runtime kernels are a library of their own: executorch's stock
# quantized kernels register some of the same names, and the runtime aborts on duplicates, so
# etfuse.kernels loads this one only when those names are free (see __init__.py).
QUANTIZED_RUNTIME_LIB = "libetfuse_quantized_runtime.so"
_CACHE_LAYOUT_VERSION = "2"
# Translation units per library: the eager library, and extra units linked into a runtime one.
EAGER_SOURCES = ("eager_ops.cpp", "quantized_eager.cpp", "conv_eager.cpp")
RUNTIME_EXTRA_SOURCES = {"runtime_ops.cpp": ("conv_runtime.cpp",)}


class KernelBuildError(EtfuseError, RuntimeError):
    """Compiling the etfuse kernels failed; the message holds the command and compiler output."""


@dataclasses.dataclass(frozen=True)
class BuildResult:
    directory: Path
    eager: Path
    runtime: Path
    key: str
    built: bool  # False when found in the cache

    @property
    def quantized_runtime(self) -> Path:
        return self.directory / QUANTIZED_RUNTIME_LIB


def cache_root() -> Path:
    env = os.environ.get("ETFUSE_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "etfuse" / "kernels"


def compiler() -> str:
    return os.environ.get("CXX", "g++")


def _executorch_dir() -> Path:
    import executorch

    # executorch is a namespace package in the wheel: no __file__.
    for p in executorch.__path__:
        if (Path(p) / "include" / "executorch").is_dir():
            return Path(p)
    raise KernelBuildError(f"cannot find the executorch headers (include/executorch) under {list(executorch.__path__)}")


def sources() -> list[Path]:
    files = sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp") and p.is_file())
    if not files:
        raise KernelBuildError(f"no kernel sources under {CSRC}")
    return files


_COMMON = ["-O3", "-fPIC", "-shared", "-DNDEBUG", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wno-psabi"]


def eager_command(output: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [compiler(), "-std=c++20", *_COMMON, "-fopenmp", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-I{CSRC}", *(str(CSRC / src) for src in EAGER_SOURCES), "-o", str(output)]
    for lib_dir in cpp_extension.library_paths():
        cmd += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    cmd += ["-ltorch", "-ltorch_cpu", "-lc10"]
    return cmd


def runtime_command(output: Path, source: str = "runtime_ops.cpp") -> list[str]:
    et = _executorch_dir()
    lib = et / "lib"
    cmd = [compiler(), "-std=c++17", *_COMMON, "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_USE_THREADPOOL"]
    cmd += [f"-I{et / 'include'}", f"-I{et / 'include' / 'executorch' / 'runtime' / 'core' / 'portable_type' / 'c10'}"]
    cmd += [f"-I{CSRC}", *(str(CSRC / src) for src in (source, *RUNTIME_EXTRA_SOURCES.get(source, ()))), "-o", str(output)]
    cmd += [str(lib / "libexecutorch.so"), str(lib / "libexecutorch_threadpool.so"), f"-Wl,-rpath,{lib}"]
    return cmd


def _compiler_id() -> str:
    try:
        out = subprocess.run([compiler(), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"cannot run the C++ compiler {compiler()!r}: {e}") from e
    return out.stdout.splitlines()[0] if out.stdout else compiler()


def cache_key() -> str:
    import torch
    from executorch import version as et_version

    h = hashlib.sha256()
    for part in (_CACHE_LAYOUT_VERSION, torch.__version__, et_version.__version__, compiler(), _compiler_id(), sys.platform):
        h.update(part.encode() + b"\0")
    # Commands with a placeholder output path: flags and include/library folders.
    for cmd in (eager_command(Path("OUT")), runtime_command(Path("OUT")),
                runtime_command(Path("OUT"), "quantized_runtime.cpp")):
        h.update(" ".join(cmd).encode() + b"\0")
    for path in sources():
        h.update(str(path.relative_to(CSRC)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _complete(directory: Path) -> bool:
    return all((directory / lib).is_file() for lib in (EAGER_LIB, RUNTIME_LIB, QUANTIZED_RUNTIME_LIB))


def build(force: bool = False, verbose: bool = False) -> BuildResult:
    """Return the two libraries, compiling them unless the cache already holds this build."""
    key = cache_key()
    root = cache_root()
    final = root / key
    if _complete(final) and not force:
        return BuildResult(final, final / EAGER_LIB, final / RUNTIME_LIB, key, built=False)

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        jobs = [(eager_command(tmp / EAGER_LIB), "eager (torch)"), (runtime_command(tmp / RUNTIME_LIB), "runtime (executorch)"),
                (runtime_command(tmp / QUANTIZED_RUNTIME_LIB, "quantized_runtime.cpp"), "quantized runtime (executorch)")]
        # Both compile at once: the eager one dominates (torch headers).
        procs = [
            (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cmd, what)
            for cmd, what in jobs
        ]
        failures = []
        for proc, cmd, what in procs:
            out, _ = proc.communicate()
            if verbose and out:
                print(out, file=sys.stderr)
            if proc.returncode != 0:
                failures.append(f"building the {what} library failed (exit {proc.returncode}):\n$ {shlex.join(cmd)}\n{out}")
        if failures:
            raise KernelBuildError("etfuse kernels: compilation failed\n" + "\n".join(failures))
        (tmp / "BUILD_INFO").write_text(
            "".join(f"{what}: {shlex.join(cmd)}\n" for cmd, what in jobs)
        )
        if force and final.exists():
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished the same build first; use its copy.
            if not _complete(final):
                raise
        else:
            tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return BuildResult(final, final / EAGER_LIB, final / RUNTIME_LIB, key, built=True)


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Build (or find in the cache) the etfuse kernel libraries.")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    res = build(force=args.force, verbose=args.verbose)
    print(f"{'built' if res.built else 'cached'}: {res.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
