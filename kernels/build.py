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
libraries relinked. The finished libraries are then copied into the cache:

    $ETFUSE_KERNEL_CACHE/               (default ~/.cache/etfuse/kernels/)
        <key>/                          key: hash of the sources, flags, torch/executorch versions
            libetfuse_eager.so
            libetfuse_runtime.so
            BUILD_INFO                  the ninja file that built them
            MANIFEST.json               written last: key, build inputs, compiler identity,
                                        size and sha256 of each library
        .<key>.lock                     held (filelock) while a process builds <key>
        .<key>.tmp-*/  .<key>.old-*/    a build in progress / an entry being replaced
    $ETFUSE_KERNEL_CACHE.build/<config>/  ninja's build directory (objects, build.ninja, csrc/:
                                        the copy of the sources it compiles, a file rewritten only
                                        when its bytes change, so reinstalling etfuse recompiles
                                        nothing), with its own lock; a damaged entry or --force
                                        cleans it first

The key does not involve the compiler (it is not run to find a cached build), so a complete
cache works on a machine without one; the compiler's identity is recorded in the manifest.
Before a library is mapped (ctypes / torch.ops.load_library) every library of the entry is
checked against the manifest: a damaged entry (truncated, overwritten, a foreign manifest) is
rebuilt with a one-line `KernelCacheWarning`, or, when it cannot be, fails with a
`KernelBuildError` that says what and where, never with a crash inside dlopen.

Builds take a per-key file lock (`filelock`): one process compiles while the others wait and
then use its result. A build goes to a temporary directory next to the final one and is
renamed into place; temporary directories of killed builds are removed once their lock is free.
Directories are made 0755 and files 0644 whatever the umask, so a cache built by one user (an
image build as root) is usable by others; a user who cannot use the cache (it is unreadable, or
an entry is missing and it is not writable) falls back to the per-user default with a warning.
Flags target the x86-64 baseline (no -march=native: the cache may be shared between machines);
the hot loops carry AVX2+FMA copies selected at runtime.

C++ applications build the runtime kernels themselves, with the CMake package in cmake/
(`etfuse.kernels.cmake_prefix_path`, target etfuse::kernels): it compiles the same files with the
same flags, read from cmake/etfuse-kernels-sources.cmake, which `cmake_files()` writes from the
catalog and the constants below (`python -m etfuse.kernels --write-cmake`).

Why not `torch.utils.cpp_extension.load`: it maps the library into the building process (the
ExecuTorch runtime aborts when a kernel is registered twice, and the cached copy is mapped
later), and it compiles every unit against the torch headers and links torch_python, which
the runtime libraries must not. Its include/library paths are used; ninja does the rest.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Optional
from etfuse.errors import EtfuseError

import filelock

CSRC = Path(__file__).resolve().parent / "csrc"
EAGER_LIB = "libetfuse_eager.so"
RUNTIME_LIB = "libetfuse_runtime.so"
_CACHE_LAYOUT_VERSION = "5"
LIBRARIES = (EAGER_LIB, RUNTIME_LIB)
MANIFEST = "MANIFEST.json"
_MANIFEST_FORMAT = 1
# Temporary (.<key>.tmp-*), replaced (.<key>.old-*) and, from older versions, .<key>.<random>
# directories next to the entries. Older versions took no lock: their directories are only
# removed once they are this old (seconds), so a build running in parallel is not destroyed.
_SCRATCH_RE = re.compile(r"^\.([0-9a-f]{20})\.(tmp-|old-)?.+$")
_UNLOCKED_SCRATCH_AGE = 2 * 3600.0
_DIR_MODE = 0o755
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


@dataclasses.dataclass(frozen=True)
class BuildResult:
    directory: Path
    eager: Path
    runtime: Path
    key: str
    built: bool  # False when found in the cache


def default_cache_root() -> Path:
    """The per-user cache: ~/.cache/etfuse/kernels."""
    return Path.home() / ".cache" / "etfuse" / "kernels"


def cache_root() -> Path:
    env = os.environ.get("ETFUSE_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return default_cache_root()


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
    """build.ninja: each op file compiled once per library flavour (the eager ones against a
    precompiled header of the torch headers), entry.cpp once per library, core/kernels.cpp (the
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
    # The precompiled header: gcc uses eager/eager_pch.h.gch for `-include eager/eager_pch.h`
    # when it was built with the same flags (a stale or foreign one is ignored, never wrong).
    lines += ["rule pch_eager",
              "  command = cp $in $header && $cxx -MMD -MF $out.d $eager_cflags -x c++-header -c $in -o $out",
              "  depfile = $out.d", "  deps = gcc", "  description = precompile $in", "",
              f"build eager/eager_pch.h.gch: pch_eager {shlex.quote(str(csrc / 'eager_pch.h'))}",
              "  header = eager/eager_pch.h",
              *(f"build {_object(src)}: cxx_runtime {shlex.quote(str(csrc / src))}" for src in CORE_SOURCES), ""]
    pch = "-include eager/eager_pch.h"
    objects_built = set()
    for lib, srcs in libraries.items():
        flavour = LIBRARY_FLAVOURS.get(lib, "runtime")
        objs = []
        for src in srcs:
            obj = f"{flavour}/{Path(src).with_suffix('.o').as_posix()}"
            if obj not in objects_built:
                if flavour == "eager":
                    lines += [f"build {obj}: cxx_eager {shlex.quote(str(csrc / src))} | eager/eager_pch.h.gch",
                              f"  defines = {pch}"]
                else:
                    lines.append(f"build {obj}: cxx_{flavour} {shlex.quote(str(csrc / src))}")
                objects_built.add(obj)
            objs.append(obj)
        if lib in ENTRY_PREFIX:
            obj = f"{lib}.entry.o"
            lines += [f"build {obj}: cxx_{flavour} {shlex.quote(str(csrc / ENTRY_SOURCE))}",
                      f"  defines = -DETFUSE_LIBRARY_PREFIX={ENTRY_PREFIX[lib]}"]
            objs.append(obj)
        if lib in (EAGER_LIB, RUNTIME_LIB, PROBE_LIB):
            objs += [_object(src) for src in CORE_SOURCES]
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


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


def verify(directory: Path, key: Optional[str] = None, inputs: Optional[dict] = None) -> Optional[str]:
    """None when `directory` holds a complete build that matches its manifest (and `key` /
    `inputs` when given); otherwise what is wrong, in a few words. Reads and hashes each library;
    maps nothing."""
    directory = Path(directory)
    key = directory.name if key is None else key
    try:
        if not directory.is_dir():
            return "missing"
        manifest_path = directory / MANIFEST
        try:
            data = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            return f"no {MANIFEST} (an interrupted build or an older etfuse)"
        except (ValueError, UnicodeDecodeError) as e:
            return f"{MANIFEST} is damaged ({e})"
        if not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT or not isinstance(data.get("files"), dict):
            return f"{MANIFEST} is not a manifest this etfuse writes"
        if data.get("key") != key:
            return f"a foreign build (its manifest is for key {data.get('key')!r})"
        if inputs is not None and data.get("inputs") != inputs:
            return "a foreign build (its manifest records other build inputs)"
        for name in LIBRARIES:
            want = data["files"].get(name)
            if not isinstance(want, dict):
                return f"the manifest does not list {name}"
            path = directory / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return f"{name} is missing"
            if size != want.get("size"):
                return f"{name} has {size} bytes where the manifest says {want.get('size')}"
            if _sha256(path) != want.get("sha256"):
                return f"{name} does not match the sha256 in the manifest"
    except PermissionError as e:
        return f"cannot be read by this user ({e.strerror}: {e.filename})"
    except OSError as e:
        return f"cannot be read ({e})"
    return None


def _complete(directory: Path) -> bool:
    return verify(directory) is None


class _CacheNotWritable(Exception):
    pass


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


def _lock(root: Path, key: str) -> filelock.FileLock:
    return filelock.FileLock(str(root / f".{key}.lock"), mode=0o644)


def _clean_scratch(root: Path, held_key: Optional[str] = None) -> None:
    """Remove the temporary directories of builds that are not running (their key's lock is
    free, or is `held_key`, the one this process holds). Best effort."""
    try:
        entries = [e for e in os.scandir(root) if _SCRATCH_RE.match(e.name) and e.is_dir(follow_symlinks=False)]
        # (".<key>.lock" files do not match: they are not directories)
    except OSError:
        return
    now = time.time()
    for entry in entries:
        m = _SCRATCH_RE.match(entry.name)
        key = m.group(1)
        if not m.group(2):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < _UNLOCKED_SCRATCH_AGE:
                    continue
            except OSError:
                continue
        if key == held_key:
            shutil.rmtree(entry.path, ignore_errors=True)
            continue
        lock = _lock(root, key)
        try:
            lock.acquire(timeout=0)
        except (filelock.Timeout, OSError):
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            lock.release()


def _write_manifest(directory: Path, key: str, inputs: dict, compiler_id: str) -> None:
    data = {
        "format": _MANIFEST_FORMAT,
        "key": key,
        "compiler": {"command": compiler(), "version": compiler_id},
        "inputs": inputs,
        "files": {name: {"size": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
                  for name in LIBRARIES},
    }
    part = directory / (MANIFEST + ".part")
    part.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.chmod(part, _FILE_MODE)
    os.replace(part, directory / MANIFEST)


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


def _compile(tmp: Path, root: Path, inputs: dict, clean: bool, verbose: bool) -> None:
    build_dir = _build_dir(root, inputs)
    with _build_lock(build_dir).acquire(timeout=_lock_timeout()):
        text = _run_ninja(build_dir, inputs["libraries"], LIBRARIES, clean, verbose)
        for name in LIBRARIES:
            shutil.copyfile(build_dir / name, tmp / name)
    (tmp / "BUILD_INFO").write_text(text)
    for name in (*LIBRARIES, "BUILD_INFO"):
        os.chmod(tmp / name, _FILE_MODE)


def probe_library(verbose: bool = False) -> Path:
    """The benchmark-only library (`etfuse_probe_stream_add`, a STREAM-add loop on the ExecuTorch
    threadpool), built on demand in the build directory; production libraries do not hold it."""
    inputs = build_inputs()
    build_dir = _build_dir(cache_root(), inputs)
    with _build_lock(build_dir).acquire(timeout=_lock_timeout()):
        _run_ninja(build_dir, inputs["libraries"], [PROBE_LIB], False, verbose)
    return build_dir / PROBE_LIB


def _build_in(root: Path, key: str, inputs: dict, force: bool, verbose: bool) -> BuildResult:
    final = root / key
    problem = "a rebuild was asked for" if force else verify(final, key, inputs)
    if problem is None:
        _clean_scratch(root)
        return BuildResult(final, final / EAGER_LIB, final / RUNTIME_LIB, key, built=False)

    try:
        _makedirs(root)
        lock = _lock(root, key)
        lock.acquire(timeout=_lock_timeout())
    except filelock.Timeout as e:
        raise KernelBuildError(
            f"etfuse kernels: waited {_lock_timeout():g} s for another process building {final} "
            f"(lock {root / f'.{key}.lock'}); set ETFUSE_KERNEL_LOCK_TIMEOUT to wait longer") from e
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise _CacheNotWritable(f"{final}: {problem}; {root} is not writable ({e.strerror})") from e
        raise KernelBuildError(f"etfuse kernels: cannot create the kernel cache {root}: {e}") from e
    try:
        if not force:
            # Another process may have built it while this one waited.
            problem = verify(final, key, inputs)
            if problem is None:
                return BuildResult(final, final / EAGER_LIB, final / RUNTIME_LIB, key, built=False)
        _clean_scratch(root, held_key=key)
        if problem != "missing" and not force:
            warnings.warn(f"etfuse kernels: the cache entry {final} is damaged ({problem}); rebuilding it",
                          KernelCacheWarning, stacklevel=4)
        try:
            compiler_id = _compiler_id()
        except KernelBuildError as e:
            raise KernelBuildError(
                f"etfuse kernels: no usable build in the cache ({final}: {problem}) and none can be made: {e}. "
                "Install a C++ compiler, or prebuild the cache with `python -m etfuse.kernels` where one exists "
                "and point ETFUSE_KERNEL_CACHE at it") from e
        tmp = root / f".{key}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        os.chmod(tmp, _DIR_MODE)
        try:
            _compile(tmp, root, inputs, clean=force or problem != "missing", verbose=verbose)
            _write_manifest(tmp, key, inputs, compiler_id)  # last: it vouches for the files above
            old = None
            if final.exists() or final.is_symlink():
                # Renamed aside, not rewritten: a process that mapped the old files keeps them.
                old = root / f".{key}.old-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
            os.rename(tmp, final)
            tmp = None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
    return BuildResult(final, final / EAGER_LIB, final / RUNTIME_LIB, key, built=True)


def build(force: bool = False, verbose: bool = False) -> BuildResult:
    """Return the libraries, compiling them unless the cache already holds this build intact.

    Checks the cached libraries against the entry's manifest (before anything maps them) and
    rebuilds a damaged entry; one process per key builds at a time. When the cache cannot be
    used by this user, falls back to the per-user cache with a `KernelCacheWarning`."""
    inputs = build_inputs()
    key = _key_of(inputs)
    root = cache_root()
    try:
        return _build_in(root, key, inputs, force, verbose)
    except _CacheNotWritable as e:
        fallback = default_cache_root()
        if fallback.resolve() == root.resolve():
            raise KernelBuildError(f"etfuse kernels: cannot use the kernel cache: {e}; "
                                   "set ETFUSE_KERNEL_CACHE to a writable directory") from None
        warnings.warn(f"etfuse kernels: the kernel cache {root} is not usable by this user ({e}); "
                      f"using {fallback} instead", KernelCacheWarning, stacklevel=2)
        try:
            return _build_in(fallback, key, inputs, force, verbose)
        except _CacheNotWritable as e2:
            raise KernelBuildError(f"etfuse kernels: cannot use {root} nor the per-user cache: {e2}; "
                                   "set ETFUSE_KERNEL_CACHE to a writable directory") from None


@dataclasses.dataclass(frozen=True)
class CacheStatus:
    root: Path
    directory: Path
    key: str
    problem: Optional[str]  # None: complete and matching its manifest
    manifest: Optional[dict]  # the parsed manifest when readable

    @property
    def ok(self) -> bool:
        return self.problem is None


def check() -> CacheStatus:
    """Verify this build's cache entry against its manifest; builds nothing, runs no compiler."""
    inputs = build_inputs()
    key = _key_of(inputs)
    root = cache_root()
    final = root / key
    problem = verify(final, key, inputs)
    manifest = None
    try:
        manifest = json.loads((final / MANIFEST).read_text())
    except (OSError, ValueError):
        pass
    return CacheStatus(root, final, key, problem, manifest)


# --- the CMake package ------------------------------------------------------------------------

CMAKE_DIR = Path(__file__).resolve().parent / "cmake"  # etfuse.kernels.cmake_prefix_path
CMAKE_SOURCES = "etfuse-kernels-sources.cmake"
CMAKE_VERSION_FILE = "etfuse-config-version.cmake"


def runtime_ops_by_file() -> dict[str, list[str]]:
    """Op file (csrc/ops/<file>.cpp, by stem) -> the runtime ops it registers, in catalog order."""
    files = {Path(src).stem: [] for src in library_sources()[RUNTIME_LIB]}
    for op in kernel_ops():
        files[op.kernel].append(f"{op.namespace}::{op.out_name}")
        if op.inplace:
            files[op.kernel].append(f"{op.namespace}::{op.inplace_name}")
    return files


def _cmake_list(name: str, items, per_line: bool = False) -> str:
    # every item here is a file name, op name or flag: nothing CMake would need quoted but `;`
    bad = [i for i in items if re.search(r'[\s;"#()$\\]', i)]
    if bad:
        raise KernelBuildError(f"cannot write {bad[0]!r} into {CMAKE_SOURCES}")
    if per_line:
        return f"set({name}\n" + "".join(f"    {i}\n" for i in items) + ")"
    return f"set({name} {' '.join(items)})"


def cmake_files() -> dict[str, str]:
    """The generated files of the CMake package (name in CMAKE_DIR -> text): the runtime library's
    sources and flags (the constants above and the catalog), and the package's version."""
    from etfuse import __version__

    by_file = runtime_ops_by_file()
    head = ("# Generated by `python -m etfuse.kernels --write-cmake` from kernels/build.py and the op\n"
            "# catalog (etfuse.backend_ops); do not edit: tests/test_cmake_package.py checks it is current.\n")
    lines = [head.rstrip("\n"),
             _cmake_list("ETFUSE_KERNELS_VERSION", [__version__]),
             _cmake_list("ETFUSE_KERNELS_CXX_STANDARD", [str(RUNTIME_CXX_STANDARD)]),
             "# runtime flags of the ninja build (`compile_flags()[\"runtime\"]`) but executorch's, which come",
             "# with executorch::runtime, and -fPIC (POSITION_INDEPENDENT_CODE)",
             _cmake_list("ETFUSE_KERNELS_COMPILE_OPTIONS", OPTIMIZE_OPTIONS),
             _cmake_list("ETFUSE_KERNELS_COMPILE_DEFINITIONS", RUNTIME_DEFINITIONS),
             "# relative to csrc/: compiled whatever ops are selected",
             _cmake_list("ETFUSE_KERNELS_CORE_SOURCES", CORE_SOURCES),
             _cmake_list("ETFUSE_KERNELS_ENTRY_SOURCE", [ENTRY_SOURCE]),
             _cmake_list("ETFUSE_KERNELS_ENTRY_DEFINITIONS", [f"ETFUSE_LIBRARY_PREFIX={ENTRY_PREFIX[RUNTIME_LIB]}"]),
             "# op files (csrc/ops/<file>.cpp) and, per file, the ops it registers",
             _cmake_list("ETFUSE_KERNELS_OP_FILES", list(by_file), per_line=True)]
    lines += [_cmake_list(f"ETFUSE_KERNELS_OPS_{stem}", ops) for stem, ops in by_file.items()]
    major = __version__.split(".")[0]
    version = "\n".join([
        head.rstrip("\n"),
        f'set(PACKAGE_VERSION "{__version__}")',
        "# the sources are compiled by the consumer: any architecture; one major version (the op names",
        "# a program calls are the interface)",
        "if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)",
        "  set(PACKAGE_VERSION_COMPATIBLE FALSE)",
        f'elseif(NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL "" AND NOT PACKAGE_FIND_VERSION_MAJOR EQUAL {major})',
        "  set(PACKAGE_VERSION_COMPATIBLE FALSE)",
        "else()",
        "  set(PACKAGE_VERSION_COMPATIBLE TRUE)",
        "  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)",
        "    set(PACKAGE_VERSION_EXACT TRUE)",
        "  endif()",
        "endif()", ""])
    return {CMAKE_SOURCES: "\n".join(lines) + "\n", CMAKE_VERSION_FILE: version}


def stale_cmake_files(directory: Path = CMAKE_DIR) -> list[str]:
    """The generated CMake files in `directory` that differ from `cmake_files()` (or are missing)."""
    stale = []
    for name, text in cmake_files().items():
        try:
            if (directory / name).read_text() == text:
                continue
        except OSError:
            pass
        stale.append(name)
    return stale


def write_cmake(directory: Path = CMAKE_DIR) -> list[Path]:
    """Write the generated CMake files that changed; returns them."""
    written = []
    for name, text in cmake_files().items():
        path = directory / name
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        path.write_text(text)
        written.append(path)
    return written


def cmake_prefix_path() -> str:
    """CMAKE_PREFIX_PATH for a consumer on this machine: etfuse's package and executorch's."""
    return f"{CMAKE_DIR};{_executorch_dir() / 'share' / 'cmake'}"


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m etfuse.kernels",
        description="Build the etfuse kernel libraries into the kernel cache (or find them there) and print "
                    "where it is. For images and CI: a prebuilt cache works later without a compiler.")
    ap.add_argument("--check", action="store_true",
                    help="only verify this build's cache entry against its manifest (exit 1 if it is not usable); "
                         "builds nothing, needs no compiler")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the compiler output")
    ap.add_argument("--write-cmake", action="store_true",
                    help=f"rewrite the CMake package's generated files ({CMAKE_SOURCES}, {CMAKE_VERSION_FILE} in "
                         f"{CMAKE_DIR}) from the catalog and this module's flags; builds nothing")
    ap.add_argument("--cmake-prefix-path", action="store_true",
                    help="print the CMAKE_PREFIX_PATH that finds the etfuse and executorch CMake packages")
    args = ap.parse_args(argv)
    if args.cmake_prefix_path:
        print(cmake_prefix_path())
        return 0
    if args.write_cmake:
        for path in write_cmake():
            print(f"wrote {path}")
        return 0
    if args.check:
        st = check()
        print(f"cache: {st.root}")
        print(f"entry: {st.directory}")
        if st.ok:
            comp = (st.manifest or {}).get("compiler", {})
            print(f"ok: {len(LIBRARIES)} libraries match {MANIFEST} (built with {comp.get('version', '?')})")
            return 0
        print(f"not usable: {st.problem}")
        return 1
    try:
        res = build(force=args.force, verbose=args.verbose)
    except KernelBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"cache: {res.directory.parent}")
    print(f"{'built' if res.built else 'cached'}: {res.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
