"""The kernel cache: one entry per build of the kernel libraries, checked before anything maps it.

    $ETFUSE_KERNEL_CACHE/               (default ~/.cache/etfuse/kernels/)
        <key>/                          key: hash of the sources, flags, torch/executorch versions
            libetfuse_runtime.so        built on first use (`etfuse.kernels.load()`)
            libetfuse_eager.so          built when asked for (`etfuse.kernels.load(eager=True)`)
            BUILD_INFO                  the ninja file that built them
            MANIFEST.json               written last: key, build inputs, compiler identity,
                                        size and sha256 of each library the entry holds
        .<key>.lock                     held (filelock) while a process builds <key>
        .<key>.tmp-*/  .<key>.old-*/    a build in progress / an entry being replaced

An entry holds the libraries asked for so far: the first run of a program needs only the runtime
library, and the torch-eager one (whose units compile against the torch headers: most of a
full build's time) is added to the entry when something asks for it. Adding one writes a new
entry (the libraries already there are copied, not rebuilt) and renames it into place.

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
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import time
import uuid
import warnings
from pathlib import Path
from typing import Iterable, Optional

import filelock

from .build import (EAGER_LIB, LIBRARIES, RUNTIME_LIB, KernelBuildError, KernelCacheWarning, _DIR_MODE, _FILE_MODE,
                    _compile, _compiler_id, _key_of, _lock_timeout, _makedirs, build_inputs, compiler)

MANIFEST = "MANIFEST.json"
_MANIFEST_FORMAT = 1
# Temporary (.<key>.tmp-*), replaced (.<key>.old-*) and, from older versions, .<key>.<random>
# directories next to the entries. Older versions took no lock: their directories are only
# removed once they are this old (seconds), so a build running in parallel is not destroyed.
_SCRATCH_RE = re.compile(r"^\.([0-9a-f]{20})\.(tmp-|old-)?.+$")
_UNLOCKED_SCRATCH_AGE = 2 * 3600.0


@dataclasses.dataclass(frozen=True)
class BuildResult:
    directory: Path
    key: str
    built: bool  # False when found in the cache
    libraries: tuple[str, ...] = LIBRARIES  # what the entry holds

    @property
    def eager(self) -> Optional[Path]:
        return self.directory / EAGER_LIB if EAGER_LIB in self.libraries else None

    @property
    def runtime(self) -> Optional[Path]:
        return self.directory / RUNTIME_LIB if RUNTIME_LIB in self.libraries else None


def default_cache_root() -> Path:
    """The per-user cache: ~/.cache/etfuse/kernels."""
    return Path.home() / ".cache" / "etfuse" / "kernels"


def cache_root() -> Path:
    env = os.environ.get("ETFUSE_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return default_cache_root()



def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _manifest_libraries(directory: Path) -> tuple[str, ...]:
    """The libraries an entry's manifest lists (in LIBRARIES order); () when it cannot be read."""
    try:
        files = json.loads((directory / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(name for name in LIBRARIES if name in files)


def verify(directory: Path, key: Optional[str] = None, inputs: Optional[dict] = None,
           libraries: Iterable[str] = LIBRARIES) -> Optional[str]:
    """None when `directory` holds an intact build of `libraries` that matches its manifest (and
    `key` / `inputs` when given); otherwise what is wrong, in a few words ("holds no <library>"
    for an intact entry without one of them). Reads and hashes each library the entry holds;
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
        if (not isinstance(data, dict) or data.get("format") != _MANIFEST_FORMAT or not isinstance(data.get("files"), dict)
                or not data["files"] or not set(data["files"]) <= set(LIBRARIES)):
            return f"{MANIFEST} is not a manifest this etfuse writes"
        if data.get("key") != key:
            return f"a foreign build (its manifest is for key {data.get('key')!r})"
        if inputs is not None and data.get("inputs") != inputs:
            return "a foreign build (its manifest records other build inputs)"
        for name, want in data["files"].items():
            if not isinstance(want, dict):
                return f"the manifest's entry for {name} is damaged"
            path = directory / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return f"{name} is missing"
            if size != want.get("size"):
                return f"{name} has {size} bytes where the manifest says {want.get('size')}"
            if _sha256(path) != want.get("sha256"):
                return f"{name} does not match the sha256 in the manifest"
        for name in libraries:
            if name not in data["files"]:
                return f"holds no {name}"
    except PermissionError as e:
        return f"cannot be read by this user ({e.strerror}: {e.filename})"
    except OSError as e:
        return f"cannot be read ({e})"
    return None


def _complete(directory: Path) -> bool:
    return verify(directory) is None


class _CacheNotWritable(Exception):
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
                  for name in LIBRARIES if (directory / name).exists()},
    }
    part = directory / (MANIFEST + ".part")
    part.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.chmod(part, _FILE_MODE)
    os.replace(part, directory / MANIFEST)



def _build_in(root: Path, key: str, inputs: dict, libraries: tuple[str, ...], force: bool, verbose: bool) -> BuildResult:
    final = root / key
    problem = "a rebuild was asked for" if force else verify(final, key, inputs, libraries)
    if problem is None:
        _clean_scratch(root)
        return BuildResult(final, key, built=False, libraries=_manifest_libraries(final))

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
            problem = verify(final, key, inputs, libraries)
            if problem is None:
                return BuildResult(final, key, built=False, libraries=_manifest_libraries(final))
        _clean_scratch(root, held_key=key)
        # An intact entry without some of `libraries` keeps what it holds; anything else is rebuilt.
        kept = () if force or verify(final, key, inputs, ()) is not None else _manifest_libraries(final)
        damaged = not kept and problem != "missing" and not force
        if damaged:
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
            for name in kept:
                shutil.copyfile(final / name, tmp / name)
                os.chmod(tmp / name, _FILE_MODE)
            missing = tuple(name for name in LIBRARIES if name in libraries and name not in kept)
            _compile(tmp, root, inputs, missing, clean=force or damaged, verbose=verbose)
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
    return BuildResult(final, key, built=True, libraries=_manifest_libraries(final))


def build(force: bool = False, verbose: bool = False, libraries: Iterable[str] = LIBRARIES) -> BuildResult:
    """Return the cache entry holding `libraries` (default: both), compiling those it lacks unless
    the cache already holds them intact.

    Checks the cached libraries against the entry's manifest (before anything maps them) and
    rebuilds a damaged entry; one process per key builds at a time. When the cache cannot be
    used by this user, falls back to the per-user cache with a `KernelCacheWarning`."""
    libraries = tuple(libraries)
    unknown = set(libraries) - set(LIBRARIES)
    if unknown or not libraries:
        raise ValueError(f"etfuse kernels: libraries must be some of {LIBRARIES}, not {libraries}")
    inputs = build_inputs()
    key = _key_of(inputs)
    root = cache_root()
    try:
        return _build_in(root, key, inputs, libraries, force, verbose)
    except _CacheNotWritable as e:
        fallback = default_cache_root()
        if fallback.resolve() == root.resolve():
            raise KernelBuildError(f"etfuse kernels: cannot use the kernel cache: {e}; "
                                   "set ETFUSE_KERNEL_CACHE to a writable directory") from None
        warnings.warn(f"etfuse kernels: the kernel cache {root} is not usable by this user ({e}); "
                      f"using {fallback} instead", KernelCacheWarning, stacklevel=2)
        try:
            return _build_in(fallback, key, inputs, libraries, force, verbose)
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


def check(libraries: Iterable[str] = LIBRARIES) -> CacheStatus:
    """Verify this build's cache entry (holding `libraries`) against its manifest; builds nothing,
    runs no compiler."""
    inputs = build_inputs()
    key = _key_of(inputs)
    root = cache_root()
    final = root / key
    problem = verify(final, key, inputs, tuple(libraries))
    manifest = None
    try:
        manifest = json.loads((final / MANIFEST).read_text())
    except (OSError, ValueError):
        pass
    return CacheStatus(root, final, key, problem, manifest)
