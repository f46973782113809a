"""Build the etfuse C++ kernels: one shared library for torch eager, one for the ExecuTorch runtime.

Each kernel-backed op is one file under `csrc/ops/` (its core call and both registrations,
through `csrc/adapter.h`), compiled twice: with -DETFUSE_EAGER into the eager library and with
-DETFUSE_RUNTIME into the runtime library. Every name the runtime library registers is etfuse's
(`etfuse::*`; quantized_decomposed ops as their twins, backend_ops/runtime_names.py), so it can
share a process with executorch's stock quantized kernels. The files are derived from the catalog
(`library_sources()`), and every file under csrc/ops must belong to a record and vice versa.

Compiling is ninja's job (the `ninja` package, or ninja on PATH): a stable build directory per
build configuration (torch/executorch versions, flags) next to the cache keeps the object
files, so after touching one op file only its two translation units are recompiled and the
libraries relinked, and each library is built only when asked for (the eager one's units compile
against the torch headers: most of a full build's time). The finished libraries are copied into
the cache (cache.py):

    $ETFUSE_KERNEL_CACHE.build/<config>/  ninja's build directory (objects, build.ninja, csrc/:
                                        the copy of the sources it compiles, a file rewritten only
                                        when its bytes change, so reinstalling etfuse recompiles
                                        nothing), with its own lock; a damaged entry or --force
                                        cleans it first

Flags target the x86-64 baseline (no -march=native: the cache may be shared between machines);
the hot loops carry AVX2+FMA copies selected at runtime. The CMake package compiles the same
files with the same flags (cmake_package.py).

Why not `torch.utils.cpp_extension.load`: it maps the library into the building process (the
ExecuTorch runtime aborts when a kernel is registered twice, and the cached copy is mapped
later), and it compiles every unit against the torch headers and links torch_python, which
the runtime libraries must not. Its include/library paths are used; ninja does the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import filelock

from etfuse.errors import EtfuseError

CSRC = Path(__file__).resolve().parent / "csrc"
EAGER_LIB = "libetfuse_eager.so"
RUNTIME_LIB = "libetfuse_runtime.so"
_CACHE_LAYOUT_VERSION = "5"
LIBRARIES = (EAGER_LIB, RUNTIME_LIB)
_DIR_MODE = 0o755  # the cache's directories and files, whatever the umask (cache.py)
_FILE_MODE = 0o644


# How long a process waits for another one's build of the same key (seconds).
def _lock_timeout() -> float:
    try:
        return float(os.environ.get("ETFUSE_KERNEL_LOCK_TIMEOUT", "3600"))
    except ValueError:
        return 3600.0
LIBRARY_FLAVOURS = {EAGER_LIB: "eager", RUNTIME_LIB: "runtime"}
# The per-library C entry points (csrc/entry.cpp): <prefix>_isa, <prefix>_set_isa, ...
ENTRY_PREFIX = {EAGER_LIB: "etfuse_eager", RUNTIME_LIB: "etfuse_runtime"}
# The benchmark-only library (memory-bandwidth probe): built on demand, never in the cache entry.
PROBE_LIB = "libetfuse_probe.so"



class KernelBuildError(EtfuseError, RuntimeError):
    """The etfuse kernels could not be built or found; the message says what and where (for a
    failed compile: the command and the compiler output)."""


class KernelCacheWarning(RuntimeWarning):
    """A kernel cache entry was damaged and is rebuilt, or the cache is not usable by this user."""



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


def kernel_ops() -> list:
    """The catalog's ops whose `.out` kernels the libraries register (records whose `kernel` names
    a file of csrc/ops; for an op of a shared namespace, its etfuse twin, not the op)."""
    from etfuse.backend_ops import CATALOG, SHARED_NAMESPACES

    return [op for op in CATALOG if op.kernel and op.namespace not in SHARED_NAMESPACES]


def library_sources() -> dict[str, list[str]]:
    """Op files (relative to csrc) per library, derived from the catalog: every file goes into
    both libraries. Checks that every file under csrc/ops has a record and every record's file
    exists."""
    files = {p.stem for p in (CSRC / "ops").glob("*.cpp")}
    named = {op.kernel for op in kernel_ops()}
    problems = []
    if files - named:
        problems.append(f"kernel files without a catalog record: {sorted(f'ops/{f}.cpp' for f in files - named)}")
    if named - files:
        problems.append(f"catalog records naming missing kernel files: {sorted(f'ops/{f}.cpp' for f in named - files)}")
    if problems:
        raise KernelBuildError("etfuse kernels: the catalog and csrc/ops do not match: " + "; ".join(problems))
    ops = [f"ops/{f}.cpp" for f in sorted(named)]
    return {EAGER_LIB: ops, RUNTIME_LIB: list(ops)}


# --- the runtime library's build description -------------------------------------------------
# Shared by both builds of the runtime kernels: the ninja build here (libetfuse_runtime.so) and
# the CMake package (cmake/etfuse-config.cmake), which reads them from
# cmake/etfuse-kernels-sources.cmake, written by `cmake_files()` (`python -m
# etfuse.kernels --write-cmake`; a test checks it is current). No ISA flag: the sources
# pick their x86 paths themselves (target attributes, cpuid), so the same flags build for aarch64.
RUNTIME_CXX_STANDARD = 17
OPTIMIZE_OPTIONS = ("-O3", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wno-psabi")
RUNTIME_DEFINITIONS = ("NDEBUG", "ETFUSE_RUNTIME")
CORE_SOURCES = ("core/kernels.cpp",)  # the GEMM and conv loops, under every op file
PCH_FLAVOURS = ("eager", "runtime")  # csrc/<flavour>_pch.h, forced into the op files (ninja build only)
ENTRY_SOURCE = "entry.cpp"  # the C entry points, with -DETFUSE_LIBRARY_PREFIX=ENTRY_PREFIX[lib]
# What executorch's CMake package puts on executorch::runtime (its libraries are compiled with
# them): spelled out here, the CMake package gets them by linking that target.
EXECUTORCH_DEFINITIONS = ("C10_USING_CUSTOM_GENERATED_MACROS", "ET_EVENT_TRACER_ENABLED", "ET_USE_THREADPOOL")


def compile_flags() -> dict[str, list[str]]:
    """Compiler flags per flavour ("eager": torch headers, "runtime": executorch headers)."""
    import torch
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    eager = ["-std=c++20", *OPTIMIZE_OPTIONS, "-fPIC", "-DNDEBUG", "-fopenmp", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
             "-DETFUSE_EAGER"]
    eager += [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{CSRC}"]
    et = _executorch_dir()
    runtime = [f"-std=c++{RUNTIME_CXX_STANDARD}", *OPTIMIZE_OPTIONS, "-fPIC",
               *(f"-D{d}" for d in (*EXECUTORCH_DEFINITIONS, *RUNTIME_DEFINITIONS))]
    runtime += [f"-I{et / 'include'}", f"-I{et / 'include' / 'executorch' / 'runtime' / 'core' / 'portable_type' / 'c10'}",
                f"-I{CSRC}"]
    return {"eager": eager, "runtime": runtime}


def link_flags() -> dict[str, list[str]]:
    from torch.utils import cpp_extension

    eager = ["-shared", "-fopenmp"]
    for lib_dir in cpp_extension.library_paths():
        eager += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    eager += ["-ltorch", "-ltorch_cpu", "-lc10"]
    lib = _executorch_dir() / "lib"
    runtime = ["-shared", str(lib / "libexecutorch.so"), str(lib / "libexecutorch_threadpool.so"), f"-Wl,-rpath,{lib}"]
    return {"eager": eager, "runtime": runtime}


def _object(src: str) -> str:
    """The object file of a source compiled once for every library (CORE_SOURCES)."""
    return Path(src).with_suffix(".o").as_posix()


def _ninja_file(libraries: dict[str, list[str]], csrc: Path = CSRC) -> str:
    """build.ninja: each op file compiled once per library flavour (against a precompiled header
    of the flavour's headers, csrc/<flavour>_pch.h), entry.cpp once per library, core/kernels.cpp (the
    GEMM and conv loops) once; plus the benchmark-only probe library (not a default target).
    Sources and includes are read from `csrc` (the build directory's copy, `_mirror_sources`)."""
    libraries = {**libraries, PROBE_LIB: ["bench/probe.cpp"]}
    cflags, ldflags = compile_flags(), link_flags()
    cflags = {flavour: [f"-I{csrc}" if a == f"-I{CSRC}" else a for a in flags] for flavour, flags in cflags.items()}
    q = lambda args: " ".join(shlex.quote(a).replace("$", "$$") for a in args)  # noqa: E731
    lines = ["ninja_required_version = 1.3", f"cxx = {shlex.quote(compiler())}", ""]
    for flavour in ("eager", "runtime"):
        lines += [f"{flavour}_cflags = {q(cflags[flavour])}", f"{flavour}_ldflags = {q(ldflags[flavour])}",
                  f"rule cxx_{flavour}",
                  f"  command = $cxx -MMD -MF $out.d ${flavour}_cflags $defines -c $in -o $out",
                  "  depfile = $out.d", "  deps = gcc", f"  description = {flavour} $in",
                  f"rule link_{flavour}", f"  command = $cxx $in -o $out ${flavour}_ldflags",
                  "  description = link $out", ""]
    # The precompiled headers: gcc uses <flavour>/<flavour>_pch.h.gch for `-include
    # <flavour>/<flavour>_pch.h` when it was built with the same flags (a stale or foreign one is
    # ignored, never wrong). The op files of each flavour are compiled with theirs.
    lines += ["rule pch", "  command = cp $in $header && $cxx -MMD -MF $out.d $cflags -x c++-header -c $in -o $out",
              "  depfile = $out.d", "  deps = gcc", "  description = precompile $in", ""]
    for flavour in PCH_FLAVOURS:
        lines += [f"build {flavour}/{flavour}_pch.h.gch: pch {shlex.quote(str(csrc / f'{flavour}_pch.h'))}",
                  f"  header = {flavour}/{flavour}_pch.h", f"  cflags = ${flavour}_cflags"]
    lines += [*(f"build {_object(src)}: cxx_runtime {shlex.quote(str(csrc / src))}" for src in CORE_SOURCES), ""]
    objects_built = set()
    for lib, srcs in libraries.items():
        flavour = LIBRARY_FLAVOURS.get(lib, "runtime")
        # the core first: ninja starts inputs in the order listed, and the core is the longest unit
        objs = [_object(src) for src in CORE_SOURCES] if lib in (EAGER_LIB, RUNTIME_LIB, PROBE_LIB) else []
        for src in srcs:
            obj = f"{flavour}/{Path(src).with_suffix('.o').as_posix()}"
            if obj not in objects_built:
                if flavour in PCH_FLAVOURS and src.startswith("ops/"):
                    lines += [f"build {obj}: cxx_{flavour} {shlex.quote(str(csrc / src))} | {flavour}/{flavour}_pch.h.gch",
                              f"  defines = -include {flavour}/{flavour}_pch.h"]
                else:
                    lines.append(f"build {obj}: cxx_{flavour} {shlex.quote(str(csrc / src))}")
                objects_built.add(obj)
            objs.append(obj)
        if lib in ENTRY_PREFIX:
            obj = f"{lib}.entry.o"
            lines += [f"build {obj}: cxx_{flavour} {shlex.quote(str(csrc / ENTRY_SOURCE))}",
                      f"  defines = -DETFUSE_LIBRARY_PREFIX={ENTRY_PREFIX[lib]}"]
            objs.append(obj)
        lines.append(f"build {lib}: link_{flavour} {' '.join(objs)}")
    lines += ["", f"default {' '.join(LIBRARIES)}", ""]
    return "\n".join(lines)


def _compiler_id() -> str:
    """The compiler's identity (first line of `--version`); only run when building."""
    try:
        out = subprocess.run([compiler(), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"cannot run the C++ compiler {compiler()!r} (set CXX or put g++ on PATH): {e}") from e
    return out.stdout.splitlines()[0] if out.stdout else compiler()



def build_inputs() -> dict:
    """Everything a build depends on except the compiler: versions, flags, which op files go
    into which library, sources. The cache key is a hash of it; the manifest records it."""
    import platform

    import torch
    from executorch import version as et_version

    return {
        "layout": _CACHE_LAYOUT_VERSION,
        "torch": torch.__version__,
        "executorch": et_version.__version__,
        "platform": f"{sys.platform}-{platform.machine()}",
        "cflags": compile_flags(),
        "ldflags": link_flags(),
        "libraries": library_sources(),
        "sources": {str(p.relative_to(CSRC)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sources()},
    }


def _config_of(inputs: dict) -> str:
    """The build directory's name: the inputs that make object files incompatible (not the sources)."""
    config = {k: v for k, v in inputs.items() if k not in ("sources", "libraries")}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:20]


def build_root(root: Path) -> Path:
    """Where ninja keeps its object files for the cache `root`: next to it, not inside (the cache
    holds only entries)."""
    return root.parent / f"{root.name}.build"


def _key_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def cache_key() -> str:
    """The entry's name in the cache. Computing it runs no compiler."""
    return _key_of(build_inputs())


def _makedirs(path: Path) -> None:
    """mkdir -p, with 0755 for each directory created (whatever the umask)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for d in missing:
        try:
            os.chmod(d, _DIR_MODE)
        except OSError:
            pass


def _ninja() -> str:
    try:
        import ninja  # the `ninja` package (a dependency): its binary

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found is None:
        raise KernelBuildError("etfuse kernels: ninja is needed to build the kernels (`pip install ninja`)")
    return found


def _mirror_sources(build_dir: Path) -> Path:
    """The kernel sources copied into `build_dir/csrc`, a file rewritten only when its bytes
    changed, and returned. ninja decides what is out of date by modification time, and
    reinstalling etfuse (pip writes every file anew) would otherwise make every object older
    than its sources though none changed: the next build (a new key, or the probe library)
    recompiled everything. Files no longer in the package are removed from the copy."""
    mirror = build_dir / "csrc"
    wanted = set()
    for src in sources():
        dst = mirror / src.relative_to(CSRC)
        wanted.add(dst)
        data = src.read_bytes()
        try:
            if dst.read_bytes() == data:
                continue
        except OSError:
            pass
        _makedirs(dst.parent)
        part = dst.with_name(dst.name + ".part")
        part.write_bytes(data)
        os.replace(part, dst)
    for p in mirror.rglob("*"):
        if p.is_file() and p not in wanted:
            p.unlink()
    return mirror


def _run_ninja(build_dir: Path, libraries: dict[str, list[str]], targets, clean: bool, verbose: bool) -> str:
    """Brings `targets` in `build_dir` up to date; returns the ninja file. Called with the
    build directory's lock held."""
    _makedirs(build_dir)
    text = _ninja_file(libraries, _mirror_sources(build_dir))
    path = build_dir / "build.ninja"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    ninja = _ninja()
    if clean:
        subprocess.run([ninja, "-C", str(build_dir), "-t", "clean"], capture_output=True, text=True)
    cmd = [ninja, "-C", str(build_dir), *(["-v"] if verbose else []), *targets]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise KernelBuildError(f"cannot run ninja {ninja!r}: {e}") from e
    if verbose and proc.stdout:
        print(proc.stdout, file=sys.stderr)
    if proc.returncode != 0:
        raise KernelBuildError(f"etfuse kernels: compilation failed (exit {proc.returncode}):\n$ {shlex.join(cmd)}\n"
                               f"{proc.stdout}")
    return text


def _build_dir(root: Path, inputs: dict) -> Path:
    """The build directory for `inputs`, created: next to the cache, or in the temporary folder
    when that place is not writable (a cache folder one may write in a read-only parent)."""
    name = _config_of(inputs)
    for parent in (build_root(root), Path(tempfile.gettempdir()) / f"etfuse-kernel-build-{os.getuid()}"):
        try:
            _makedirs(parent)
            if os.access(parent, os.W_OK):
                return parent / name
        except OSError:
            pass
    raise KernelBuildError(f"etfuse kernels: no writable build directory ({build_root(root)} nor the temporary folder)")


def _build_lock(build_dir: Path) -> filelock.FileLock:
    return filelock.FileLock(str(build_dir.parent / f".{build_dir.name}.lock"), mode=0o644)


def _compile(tmp: Path, root: Path, inputs: dict, libraries: tuple[str, ...], clean: bool, verbose: bool) -> None:
    """Build `libraries` in the build directory for the cache `root` and copy them into `tmp`
    (with BUILD_INFO, the ninja file)."""
    build_dir = _build_dir(root, inputs)
    with _build_lock(build_dir).acquire(timeout=_lock_timeout()):
        text = _run_ninja(build_dir, inputs["libraries"], libraries, clean, verbose)
        for name in libraries:
            shutil.copyfile(build_dir / name, tmp / name)
    (tmp / "BUILD_INFO").write_text(text)
    for name in (*libraries, "BUILD_INFO"):
        os.chmod(tmp / name, _FILE_MODE)


def probe_library(verbose: bool = False) -> Path:
    """The benchmark-only library (`etfuse_probe_stream_add`, a STREAM-add loop on the ExecuTorch
    threadpool), built on demand in the build directory; production libraries do not hold it."""
    from .cache import cache_root

    inputs = build_inputs()
    build_dir = _build_dir(cache_root(), inputs)
    with _build_lock(build_dir).acquire(timeout=_lock_timeout()):
        _run_ninja(build_dir, inputs["libraries"], [PROBE_LIB], False, verbose)
    return build_dir / PROBE_LIB
