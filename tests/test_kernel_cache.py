"""The kernel cache (etfuse.kernels.cache): verified before anything is mapped, healed when
damaged, one build per key at a time, usable without a compiler, readable by other users.

The real libraries are built once (the module fixture, into the usual cache); each test copies
that entry into a temporary cache. Rebuilds go through a stand-in compiler (CXX) that logs each
library it links and "links" by copying the good library of the same name (its translation
units become empty objects), so a healed entry is
a real, loadable one without running g++ again. Loading runs in fresh subprocesses: a damaged
library mapped by the test process would take pytest down with it.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from etfuse.kernels import build as kbuild
from etfuse.kernels import cache as kcache

COPY_CXX = """#!{python}
import os, shutil, sys, time
args = sys.argv[1:]
out = args[args.index("-o") + 1] if "-o" in args else None
if out is not None and "-c" in args:  # a translation unit (ninja): an empty object, not logged
    open(out, "w").close()
    sys.exit(0)
with open({log!r}, "a") as f:  # one "compile <library>" per library linked
    f.write(("version" if args == ["--version"] else "compile " + os.path.basename(out)) + "\\n")
if args == ["--version"]:
    print("copy-c++ 1.0")
    sys.exit(0)
time.sleep({delay})
shutil.copyfile(os.path.join({src!r}, os.path.basename(out)), out)
"""

LOAD_AND_RUN = """
import warnings
warnings.simplefilter("always")
import torch
import etfuse.kernels as k
info = k.load(eager=True)
a, b = torch.randn(1000), torch.randn(1000)
assert torch.equal(torch.ops.etfuse.add_relu.out(a, b, out=torch.empty(0)), torch.relu(a + b))
assert info.runtime is not None and info.runtime.etfuse_runtime_thread_count() >= 1
print("LOADED", info.cache_dir, "built" if info.built else "cached")
"""


@pytest.fixture(scope="module")
def warm():
    """This build's complete entry in the usual cache (compiled here only when missing)."""
    res = kcache.build()
    assert kcache.verify(res.directory) is None
    return res


def _cache_copy(warm, tmp_path) -> Path:
    root = tmp_path / "cache"
    root.mkdir()
    shutil.copytree(warm.directory, root / warm.key)
    return root


def _copy_cxx(tmp_path, warm, delay=0.0):
    log = tmp_path / "cxx.log"
    src = tmp_path / "good-libs"
    if not src.exists():
        shutil.copytree(warm.directory, src)
    p = tmp_path / "copy-cxx"
    p.write_text(COPY_CXX.format(python=sys.executable, log=str(log), src=str(src), delay=delay))
    p.chmod(0o755)
    return str(p), log


LIBS = len(kbuild.LIBRARIES)  # the fake compiler logs one `compile` line per library it makes


def _compiles(log: Path) -> list:
    return [l for l in log.read_text().splitlines() if l.startswith("compile")] if log.exists() else []


def _run(code, env_extra, timeout=300):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _assert_loaded(proc, directory):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert f"LOADED {directory} " in proc.stdout, proc.stdout


# --------------------------------------------------------------------------------------------
# 1. a damaged cache heals instead of killing every later process


@pytest.mark.parametrize("damage", ["truncate_runtime", "zero_32k_eager"])
def test_damaged_library_is_rebuilt_not_mapped(warm, tmp_path, damage):
    root = _cache_copy(warm, tmp_path)
    entry = root / warm.key
    if damage == "zero_32k_eager":  # was SIGSEGV inside torch.ops.load_library
        lib = entry / kbuild.EAGER_LIB
        with open(lib, "r+b") as f:
            f.seek(lib.stat().st_size // 4)
            f.write(b"\0" * 32768)
    else:  # was SIGBUS (exit 135) inside ctypes.CDLL
        lib = entry / kbuild.RUNTIME_LIB
        os.truncate(lib, lib.stat().st_size // 2)
    assert kcache.verify(entry) is not None
    cxx, log = _copy_cxx(tmp_path, warm)
    proc = _run(LOAD_AND_RUN, {"ETFUSE_KERNEL_CACHE": str(root), "CXX": cxx})
    _assert_loaded(proc, entry)
    warning = [l for l in proc.stderr.splitlines() if "KernelCacheWarning" in l]
    assert len(warning) == 1 and f"the cache entry {entry} is damaged" in warning[0] and lib.name in warning[0], proc.stderr
    assert len(_compiles(log)) == LIBS
    assert kcache.verify(entry) is None
    # healed for good: the next process loads it as it is
    again = _run(LOAD_AND_RUN, {"ETFUSE_KERNEL_CACHE": str(root), "CXX": cxx})
    _assert_loaded(again, entry)
    assert "cached" in again.stdout and "KernelCacheWarning" not in again.stderr
    assert len(_compiles(log)) == LIBS


def test_foreign_manifest_or_missing_manifest_is_rebuilt(warm, tmp_path, monkeypatch):
    root = _cache_copy(warm, tmp_path)
    entry = root / warm.key
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", cxx)
    manifest = json.loads((entry / kcache.MANIFEST).read_text())
    manifest["key"] = "0" * 20
    (entry / kcache.MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(kbuild.KernelCacheWarning, match="foreign build"):
        assert kcache.build().built
    assert kcache.verify(entry) is None and len(_compiles(log)) == LIBS
    (entry / kcache.MANIFEST).unlink()  # an interrupted build, or one by an older etfuse
    with pytest.warns(kbuild.KernelCacheWarning, match="no MANIFEST.json"):
        assert kcache.build().built
    assert len(_compiles(log)) == 2 * LIBS
    assert not kcache.build().built and len(_compiles(log)) == 2 * LIBS


def test_damaged_entry_without_a_compiler_is_a_clear_error(warm, tmp_path, monkeypatch):
    root = _cache_copy(warm, tmp_path)
    lib = root / warm.key / kbuild.RUNTIME_LIB
    os.truncate(lib, 1000)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", str(tmp_path / "nonexistent"))
    with pytest.warns(kbuild.KernelCacheWarning), pytest.raises(kbuild.KernelBuildError) as e:
        kcache.build()
    msg = str(e.value)
    assert str(root / warm.key) in msg and "libetfuse_runtime.so has 1000 bytes" in msg and "cannot run the C++ compiler" in msg


def test_check_command_verifies_the_manifest(warm, tmp_path):
    root = _cache_copy(warm, tmp_path)
    entry = root / warm.key
    code = "import sys, runpy; sys.argv = ['etfuse.kernels', '--check']; runpy.run_module('etfuse.kernels', run_name='__main__')"
    env = {"ETFUSE_KERNEL_CACHE": str(root), "CXX": str(tmp_path / "nonexistent")}
    ok = _run(code, env)
    assert ok.returncode == 0, ok.stderr
    assert f"cache: {root}" in ok.stdout and f"entry: {entry}" in ok.stdout and f"ok: {LIBS} libraries" in ok.stdout
    with open(entry / kbuild.EAGER_LIB, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 16)
    bad = _run(code, env)
    assert bad.returncode == 1 and "not usable: libetfuse_eager.so does not match the sha256" in bad.stdout, bad.stdout
    assert _compiles(tmp_path / "cxx.log") == []


# --------------------------------------------------------------------------------------------
# 5. a complete cache needs no compiler; files are readable by other users


def test_complete_cache_loads_without_a_compiler(warm, tmp_path):
    root = _cache_copy(warm, tmp_path)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {"ETFUSE_KERNEL_CACHE": str(root), "CXX": "/nonexistent", "PATH": str(empty_bin)}
    assert shutil.which("g++", path=str(empty_bin)) is None
    _assert_loaded(_run(LOAD_AND_RUN, env), root / warm.key)


def test_empty_cache_without_a_compiler_says_what_and_where(tmp_path):
    root = tmp_path / "cache"
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    code = """
    import etfuse.kernels as k
    try:
        k.load()
    except k.KernelBuildError as e:
        print("KernelBuildError:", e)
    """
    proc = _run(code, {"ETFUSE_KERNEL_CACHE": str(root), "CXX": "/nonexistent", "PATH": str(empty_bin)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [l for l in proc.stdout.splitlines() if l.startswith("KernelBuildError:")]
    assert f"no usable build in the cache ({root / kbuild.cache_key()}: missing)" in line
    assert "cannot run the C++ compiler '/nonexistent'" in line and "python -m etfuse.kernels" in line
    assert [p for p in root.iterdir() if not p.name.endswith(".lock")] == []


def test_built_files_are_readable_by_everyone_whatever_the_umask(warm, tmp_path, monkeypatch):
    cxx, log = _copy_cxx(tmp_path, warm)
    root = tmp_path / "shared" / "cache"
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", cxx)
    old = os.umask(0o077)
    try:
        res = kcache.build()
    finally:
        os.umask(old)
    assert res.built and len(_compiles(log)) == LIBS
    for d in (tmp_path / "shared", root, res.directory):
        assert d.stat().st_mode & 0o777 == 0o755, d
    files = list(res.directory.iterdir())
    assert {p.name for p in files} >= {*kbuild.LIBRARIES, kcache.MANIFEST}
    for p in files:
        assert p.stat().st_mode & 0o777 == 0o644, p


def test_unusable_shared_cache_falls_back_to_the_user_cache(warm, tmp_path, monkeypatch):
    """Another user's cache they cannot read (or write): a warning and the per-user cache,
    not a PermissionError traceback. Simulated (the tests run as one user; root reads anything)."""
    shared = _cache_copy(warm, tmp_path)
    user = tmp_path / "home-cache"
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(shared))
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setattr(kcache, "default_cache_root", lambda: user)
    real_sha, real_lock = kcache._sha256, kcache._lock

    def sha(path):
        if shared in Path(path).parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_sha(path)

    def lock(root, key):
        if root == shared:
            raise PermissionError(errno.EACCES, "Permission denied", str(root / f".{key}.lock"))
        return real_lock(root, key)

    monkeypatch.setattr(kcache, "_sha256", sha)
    monkeypatch.setattr(kcache, "_lock", lock)
    with pytest.warns(kbuild.KernelCacheWarning, match=f"the kernel cache {shared} is not usable by this user .*cannot be "
                                                       f"read by this user.*; using {user} instead"):
        res = kcache.build()
    assert res.directory == user / warm.key and res.built and kcache.verify(res.directory) is None
    # no fallback left: a KernelBuildError naming the directory
    monkeypatch.setattr(kcache, "default_cache_root", lambda: shared)
    with pytest.raises(kbuild.KernelBuildError, match=f"cannot use the kernel cache: .*{shared} is not writable"):
        kcache.build()


# --------------------------------------------------------------------------------------------
# 6. one build per key at a time; no temporary folders left behind


BUILD_AFTER_BARRIER = """
import os, sys, time
from etfuse.kernels import build, cache
build.build_inputs()  # the imports, before the barrier
open(sys.argv[1], "w").close()
while not all(os.path.exists(p) for p in sys.argv[2:]):
    time.sleep(0.01)
r = cache.build()
print("RESULT", "built" if r.built else "cached", r.directory)
"""


def test_processes_starting_on_an_empty_cache_build_once(warm, tmp_path):
    root = tmp_path / "cache"
    cxx, log = _copy_cxx(tmp_path, warm, delay=1.5)
    env = dict(os.environ, ETFUSE_KERNEL_CACHE=str(root), CXX=cxx)
    marks = [str(tmp_path / f"ready{i}") for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_AFTER_BARRIER, m, *marks], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for m in marks]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    results = sorted(l.split()[1] for out, _ in outs for l in out.splitlines() if l.startswith("RESULT"))
    assert results == ["built", "cached", "cached"]
    assert len(_compiles(log)) == LIBS  # was 9: each process ran the whole build
    assert kcache.verify(root / warm.key) is None


def test_stale_temporary_directories_are_removed(warm, tmp_path, monkeypatch):
    root = _cache_copy(warm, tmp_path)
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", cxx)
    other = "0123456789abcdef0123"
    killed = [root / f".{warm.key}.tmp-dead0001", root / f".{other}.tmp-dead0002", root / f".{warm.key}.old-dead0003"]
    old_style = root / f".{warm.key}.k2j4h5_x"  # an older etfuse's temporary name (it took no lock)
    young_old_style = root / f".{other}.a8b7c6_d"
    for d in (*killed, old_style, young_old_style):
        d.mkdir()
        (d / kbuild.EAGER_LIB).write_bytes(b"half a library")
    long_ago = time.time() - 3 * 3600
    os.utime(old_style, (long_ago, long_ago))
    # a build of `other` in progress in another process: its lock is held, its folder stays
    busy = root / f".{other}.tmp-busy0004"
    busy.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); "
                               "l.acquire(); print('held', flush=True); time.sleep(60)", str(root / f".{other}.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        res = kcache.build()  # a complete entry: found, and the leftovers are cleaned on the way
        assert not res.built and _compiles(log) == []
        left = sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))
        # the dead folders of this key and the old-style one are gone; `other`'s wait for its lock
        assert left == sorted([warm.key, busy.name, killed[1].name, young_old_style.name])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    kcache.build()
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == sorted([warm.key, young_old_style.name])


def test_cache_key_does_not_run_the_compiler(warm, tmp_path, monkeypatch):
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("CXX", cxx)
    assert kbuild.cache_key() == warm.key
    monkeypatch.setenv("CXX", "/nonexistent")
    assert kbuild.cache_key() == warm.key
    assert not log.exists()


def test_a_build_held_too_long_by_another_process_is_a_clear_error(warm, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setenv("ETFUSE_KERNEL_LOCK_TIMEOUT", "0.5")
    lock = root / f".{warm.key}.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); "
                               "l.acquire(); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(kbuild.KernelBuildError, match=f"waited 0.5 s for another process building {root / warm.key}"):
            kcache.build()
        assert _compiles(log) == []
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert kcache.build().built and len(_compiles(log)) == LIBS  # the holder died: its lock is free


# --------------------------------------------------------------------------------------------
# 7. the first run builds the runtime library only; the eager one is added when asked for

LOAD_RUNTIME_THEN_EAGER = """
import torch
import etfuse.kernels as k
info = k.load()
assert info.eager_library is None and info.runtime is not None
print("HOLDS", sorted(p.name for p in info.cache_dir.iterdir()))
assert not torch._C._dispatch_has_kernel_for_dispatch_key("etfuse::add_relu.out", "CPU")
info = k.load(eager=True)
a, b = torch.randn(1000), torch.randn(1000)
assert torch.equal(torch.ops.etfuse.add_relu.out(a, b, out=torch.empty(0)), torch.relu(a + b))
assert info.eager_library is not None and torch._C._dispatch_has_kernel_for_dispatch_key("etfuse::add_relu.out", "CPU")
print("LOADED", info.cache_dir, "built" if info.built else "cached")
"""


def test_load_builds_the_runtime_library_first_and_the_eager_one_when_asked(warm, tmp_path):
    root = tmp_path / "cache"
    cxx, log = _copy_cxx(tmp_path, warm)
    entry = root / warm.key
    proc = _run(LOAD_RUNTIME_THEN_EAGER, {"ETFUSE_KERNEL_CACHE": str(root), "CXX": cxx})
    _assert_loaded(proc, entry)
    assert f"HOLDS {sorted(['BUILD_INFO', kcache.MANIFEST, kbuild.RUNTIME_LIB])}" in proc.stdout
    # one link each, in that order: adding the eager library copied the runtime one, not rebuilt it
    assert _compiles(log) == [f"compile {kbuild.RUNTIME_LIB}", f"compile {kbuild.EAGER_LIB}"]
    assert kcache.verify(entry) is None
    assert kcache._manifest_libraries(entry) == kbuild.LIBRARIES


def test_an_entry_without_the_eager_library_is_not_damaged(warm, tmp_path, monkeypatch):
    root = _cache_copy(warm, tmp_path)
    entry = root / warm.key
    cxx, log = _copy_cxx(tmp_path, warm)
    monkeypatch.setenv("ETFUSE_KERNEL_CACHE", str(root))
    monkeypatch.setenv("CXX", cxx)
    manifest = json.loads((entry / kcache.MANIFEST).read_text())
    del manifest["files"][kbuild.EAGER_LIB]
    (entry / kcache.MANIFEST).write_text(json.dumps(manifest))
    (entry / kbuild.EAGER_LIB).unlink()
    assert kcache.verify(entry, libraries=[kbuild.RUNTIME_LIB]) is None
    assert kcache.verify(entry) == f"holds no {kbuild.EAGER_LIB}"
    res = kcache.build(libraries=[kbuild.RUNTIME_LIB])
    assert not res.built and res.eager is None and res.runtime == entry / kbuild.RUNTIME_LIB
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an entry that lacks a library is completed, not "damaged"
        res = kcache.build()
    assert res.built and _compiles(log) == [f"compile {kbuild.EAGER_LIB}"] and kcache.verify(entry) is None
