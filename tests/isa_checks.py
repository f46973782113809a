"""Building and running the C++ checks of tests/cpp (gemm_check.cpp, pointwise_check.cpp): one
binary per source, compiler, flags and state of the kernel headers, shared by xdist workers."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import filelock

import etfuse.kernels
import readme_consumer

CSRC = Path(etfuse.kernels.__file__).resolve().parent / "csrc"
CPP = Path(__file__).resolve().parent / "cpp"


def build(source: str, compiler: str, *flags: str, optimize: str = "-O3") -> Path:
    """tests/cpp/`source` built with `compiler`, once per source state."""
    if shutil.which(compiler) is None:
        readme_consumer.unavailable(f"{compiler} is not on PATH")
    check = CPP / source
    h = hashlib.sha256(check.read_bytes() + compiler.encode() + " ".join((optimize, *flags)).encode())
    for p in [*sorted(CSRC.rglob("*.h")), *sorted(CPP.glob("*.h"))]:
        h.update(p.read_bytes())
    binary = Path(tempfile.gettempdir()) / f"etfuse-{check.stem.replace('_', '-')}-{h.hexdigest()[:16]}"
    with filelock.FileLock(str(binary) + ".lock"):
        if not binary.is_file():
            part = binary.with_suffix(".part")
            proc = subprocess.run([compiler, "-std=c++17", optimize, *flags, f"-I{CSRC}", str(check), "-o", str(part)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-4000:]
            part.rename(binary)
    return binary


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def x86_isas_checked(source: str, optimize: str) -> tuple[set, str]:
    """tests/cpp/`source` built natively at `optimize` and run: the ISAs it printed a line for
    ("isa <name>: ..."), and its output."""
    out = run([str(build(source, "g++", optimize=optimize))])
    return {line.split()[1].rstrip(":") for line in out.splitlines()}, out


def qemu_aarch64(cpu: str, binary: Path) -> list[str]:
    """The command that runs a static aarch64 `binary` under qemu-aarch64 -cpu `cpu`."""
    if shutil.which("qemu-aarch64") is None:
        readme_consumer.unavailable("qemu-aarch64 is not on PATH")
    return ["qemu-aarch64", "-cpu", cpu, str(binary)]
