"""Build the etfuse C++ kernels: one shared library for torch eager, two for the ExecuTorch runtime.

The libraries compile the same kernel cores (`csrc/core/*.h`) through thin registration files
(`csrc/eager_ops.cpp`, `csrc/runtime_ops.cpp`, ...). They are built with the system C++ compiler
through subprocess (no ninja, no setuptools), once, into a cache directory:

    $ETFUSE_KERNEL_CACHE/               (default ~/.cache/etfuse/kernels/)
        <key>/                          key: hash of the sources, flags, torch/executorch versions
            libetfuse_eager.so
            libetfuse_runtime.so
            libetfuse_quantized_runtime.so
            BUILD_INFO                  the compiler commands
            MANIFEST.json               written last: key, build inputs, compiler identity,
                                        size and sha256 of each library
        .<key>.lock                     held (filelock) while a process builds <key>
        .<key>.tmp-*/  .<key>.old-*/    a build in progress / an entry being replaced

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
# The quantized_decomposed runtime kernels are a library of their own: executorch's stock
# quantized kernels register some of the same names, and the runtime aborts on duplicates, so
# etfuse.kernels loads this one only when those names are free (see __init__.py).
QUANTIZED_RUNTIME_LIB = "libetfuse_quantized_runtime.so"
_CACHE_LAYOUT_VERSION = "3"
LIBRARIES = (EAGER_LIB, RUNTIME_LIB, QUANTIZED_RUNTIME_LIB)
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
# Translation units per library: the eager library, and extra units linked into a runtime one.
EAGER_SOURCES = ("eager_ops.cpp", "quantized_eager.cpp", "conv_eager.cpp")
RUNTIME_EXTRA_SOURCES = {"runtime_ops.cpp": ("conv_runtime.cpp",)}


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

    @property
    def quantized_runtime(self) -> Path:
        return self.directory / QUANTIZED_RUNTIME_LIB


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
    """Everything a build depends on except the compiler: versions, flags (the commands without
    their first word), sources. The cache key is a hash of it; the manifest records it."""
    import platform

    import torch
    from executorch import version as et_version

    commands = [eager_command(Path("OUT")), runtime_command(Path("OUT")),
                runtime_command(Path("OUT"), "quantized_runtime.cpp")]
    return {
        "layout": _CACHE_LAYOUT_VERSION,
        "torch": torch.__version__,
        "executorch": et_version.__version__,
        "platform": f"{sys.platform}-{platform.machine()}",
        "commands": [cmd[1:] for cmd in commands],
        "sources": {str(p.relative_to(CSRC)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sources()},
    }


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


def _compile(tmp: Path, verbose: bool) -> None:
    jobs = [(eager_command(tmp / EAGER_LIB), "eager (torch)"), (runtime_command(tmp / RUNTIME_LIB), "runtime (executorch)"),
            (runtime_command(tmp / QUANTIZED_RUNTIME_LIB, "quantized_runtime.cpp"), "quantized runtime (executorch)")]
    # All compile at once: the eager one dominates (torch headers).
    procs = []
    try:
        for cmd, what in jobs:
            procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cmd, what))
    except OSError as e:
        for proc, _, _ in procs:
            proc.kill()
            proc.wait()
        raise KernelBuildError(f"cannot run the C++ compiler {compiler()!r}: {e}") from e
    failures = []
    for proc, cmd, what in procs:
        out, _ = proc.communicate()
        if verbose and out:
            print(out, file=sys.stderr)
        if proc.returncode != 0:
            failures.append(f"building the {what} library failed (exit {proc.returncode}):\n$ {shlex.join(cmd)}\n{out}")
    if failures:
        raise KernelBuildError("etfuse kernels: compilation failed\n" + "\n".join(failures))
    (tmp / "BUILD_INFO").write_text("".join(f"{what}: {shlex.join(cmd)}\n" for cmd, what in jobs))
    for name in (*LIBRARIES, "BUILD_INFO"):
        os.chmod(tmp / name, _FILE_MODE)


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
            _compile(tmp, verbose)
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
    args = ap.parse_args(argv)
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
