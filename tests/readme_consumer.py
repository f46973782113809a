"""The README's consumer project, built the way the README says: its "Deploying to a device"
section's `CMakeLists.txt` and its configure-and-build blocks, run verbatim in a bash shell, for
this machine and for ARM64. `main.cpp` is etfuse_runner's source (kernels/runner), so the app the
README builds is a full command-line runner that the deployment tests drive.

A build is made once per machine and source state and shared by the test modules and xdist
workers that ask for it (a file lock; the folder is keyed by the README text, the kernel sources
and the package's CMake files). Without cmake or the cross tools the tests skip, but under
CI=true they fail: CI must test the deployment route.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import filelock
import pytest

import etfuse.kernels

ROOT = Path(__file__).resolve().parent.parent
ON_CI = os.environ.get("CI") == "true"
KERNELS = Path(etfuse.kernels.__file__).resolve().parent
SECTION = "## Deploying to a device"


def unavailable(why: str):
    if ON_CI:
        pytest.fail(f"{why} (CI=true: the deployment route must be tested there)")
    pytest.skip(why)


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), flags=re.S)


def cmakelists() -> str:
    (text,) = blocks("cmake")
    return text


def build_commands(arch: str) -> str:
    """The README's bash block for `arch` ("host": the one that makes build/, "aarch64": build-arm64/)."""
    host, arm = blocks("bash")
    assert "-B build " in host and "-B build-arm64" in arm, "the README's build blocks changed: update this test"
    return host if arch == "host" else arm


def _require(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not on PATH")
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < (3, 28):
        unavailable(f"cmake >= 3.28 is needed, found {out.splitlines()[0] if out else '?'}")


def _key(arch: str) -> str:
    h = hashlib.sha256(section().encode() + arch.encode())
    for folder in ("csrc", "cmake", "runner"):
        for p in sorted((KERNELS / folder).rglob("*")):
            if p.is_file() and p.suffix in (".h", ".cpp", ".cmake", ".txt"):
                h.update(str(p.relative_to(KERNELS)).encode() + p.read_bytes())
    return h.hexdigest()[:16]


def env() -> dict:
    """This Python first on PATH (the README's `python`); ninja as CMake's generator where it is
    installed (`cmake --build -j` under make would start every compile at once); ccache where it
    is installed (CI installs it), so the test builds of the same sources compile them once."""
    e = dict(os.environ)
    e["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), e.get("PATH", "")])
    if shutil.which("ninja"):
        e.setdefault("CMAKE_GENERATOR", "Ninja")
    if shutil.which("ccache"):
        e.setdefault("CMAKE_CXX_COMPILER_LAUNCHER", "ccache")
    return e


def app(arch: str) -> Path:
    """The README's app (etfuse_runner's source as main.cpp) built for `arch`; returns its path."""
    tools = ["cmake", "bash"] + (["aarch64-linux-gnu-g++", "qemu-aarch64"] if arch == "aarch64" else [])
    _require(*tools)
    folder = Path(tempfile.gettempdir()) / f"etfuse-readme-app-{arch}-{_key(arch)}"
    binary = folder / ("build" if arch == "host" else "build-arm64") / "app"
    folder.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(folder) + ".lock"):
        if (folder / "BUILT").is_file() and binary.is_file():
            return binary
        (folder / "CMakeLists.txt").write_text(cmakelists())
        shutil.copyfile(KERNELS / "runner" / "etfuse_runner.cpp", folder / "main.cpp")
        script = "set -euo pipefail\n" + build_commands(arch)
        proc = subprocess.run(["bash", "-c", script], cwd=folder, env=env(), capture_output=True, text=True)
        assert proc.returncode == 0, (f"the README's {arch} build failed in {folder}:\n{script}\n"
                                      f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        (folder / "BUILT").write_text("")
    return binary
