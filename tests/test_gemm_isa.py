"""The float GEMM on every ISA path it has (kernels/csrc/core/gemm.h, arch/arm/gemm_neon.h):
tests/cpp/gemm_check.cpp compares `gemm::run` with a plain triple loop, on x86-64 for the
baseline, AVX2 and (where the CPU has it) AVX-512 tiles, and cross-compiled for aarch64 under
qemu-aarch64 for the portable and the NEON tiles, on a core with and one without dot products."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import filelock
import pytest

import etfuse.kernels
import readme_consumer

CSRC = Path(etfuse.kernels.__file__).resolve().parent / "csrc"
CHECK = Path(__file__).resolve().parent / "cpp" / "gemm_check.cpp"


def _build(compiler: str, *flags: str, optimize: str = "-O3") -> Path:
    """gemm_check built with `compiler`, once per source state (shared by xdist workers)."""
    if shutil.which(compiler) is None:
        readme_consumer.unavailable(f"{compiler} is not on PATH")
    h = hashlib.sha256(CHECK.read_bytes() + compiler.encode() + " ".join((optimize, *flags)).encode())
    for p in sorted(CSRC.rglob("*.h")):
        h.update(p.read_bytes())
    binary = Path(tempfile.gettempdir()) / f"etfuse-gemm-check-{h.hexdigest()[:16]}"
    with filelock.FileLock(str(binary) + ".lock"):
        if not binary.is_file():
            part = binary.with_suffix(".part")
            proc = subprocess.run([compiler, "-std=c++17", optimize, *flags, f"-I{CSRC}", str(CHECK), "-o", str(part)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-4000:]
            part.rename(binary)
    return binary


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


# -O0 as well: nothing is inlined there unless it must be, so a vector passed by value between an
# AVX2 function and a helper compiled for the base ISA (a different calling convention) shows
@pytest.mark.parametrize("optimize", ["-O3", "-O0"])
def test_x86_gemm_matches_the_reference_on_every_isa_of_this_cpu(optimize):
    out = _run([str(_build("g++", optimize=optimize))])
    checked = {line.split()[1].rstrip(":") for line in out.splitlines()}
    assert {"baseline", "avx2"} <= checked, out  # the CI machines have AVX2


@pytest.mark.parametrize("cpu", ["neoverse-n1", "cortex-a53"])
def test_aarch64_gemm_matches_the_reference_on_the_portable_and_neon_tiles(cpu):
    if shutil.which("qemu-aarch64") is None:
        readme_consumer.unavailable("qemu-aarch64 is not on PATH")
    out = _run(["qemu-aarch64", "-cpu", cpu, str(_build("aarch64-linux-gnu-g++", "-static"))])
    assert out.splitlines() == ["isa baseline: 10080 cases match", "isa neon: 10080 cases match"], out
