"""Building and running the C++ checks of tests/cpp (gemm_check.cpp, pointwise_check.cpp): one
binary per source, compiler, flags and state of the kernel headers, linked with the core kernels
(core/kernels.cpp) compiled once per compiler and flags, both shared by xdist workers; and
the whole test of a check that prints one "isa <name>: <n> cases match" line per ISA
(check_isa_loop::check_every_isa), on each target of TARGETS."""

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
CPP = Path(__file__).resolve().parent / "cpp"
CORE_KERNELS = CSRC / "core" / "kernels.cpp"


def _headers_hash(*parts: str) -> "hashlib._Hash":
    h = hashlib.sha256(" ".join(parts).encode())
    for p in [*sorted(CSRC.rglob("*.h")), CORE_KERNELS, *sorted(CPP.glob("*.h"))]:
        h.update(p.read_bytes())
    return h


def _compile_once(output: Path, cmd: list[str]) -> Path:
    """`cmd` run to write `output` (through a .part file), unless another process or test has."""
    with filelock.FileLock(str(output) + ".lock"):
        if not output.is_file():
            part = output.with_suffix(".part")
            proc = subprocess.run([*cmd, "-o", str(part)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-4000:]
            part.rename(output)
    return output


def build(source: str, compiler: str, *flags: str, optimize: str = "-O3") -> Path:
    """tests/cpp/`source` built with `compiler`, once per source state, and linked with
    core/kernels.cpp (every family's per-ISA loops, -DETFUSE_CORE_KERNELS) compiled once per
    compiler, flags and state of the kernel headers, as the library compiles it: each check
    compiled its own copy of the loops it reached before (the GEMM's in five), most of the ISA
    tests' time."""
    if shutil.which(compiler) is None:
        readme_consumer.unavailable(f"{compiler} is not on PATH")
    command = [compiler, "-std=c++17", optimize, *flags, f"-I{CSRC}"]
    h = _headers_hash(*command)
    core = _compile_once(Path(tempfile.gettempdir()) / f"etfuse-core-kernels-{h.hexdigest()[:16]}.o",
                         [*command, "-c", str(CORE_KERNELS)])
    check = CPP / source
    h.update(check.read_bytes())
    binary = Path(tempfile.gettempdir()) / f"etfuse-{check.stem.replace('_', '-')}-{h.hexdigest()[:16]}"
    return _compile_once(binary, [*command, str(check), str(core)])


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


# The ISAs besides the baseline that qemu's aarch64 CPUs give the checks: a core with dot products
# and one without.
AARCH64_ISAS = {"neoverse-n1": ["neon", "neondot"], "cortex-a53": ["neon"]}

# Where cases_match runs a check: natively at -O3, and at -O0 too (nothing inlined that need not
# be, so a vector passed between functions of different ISAs shows), and under qemu-aarch64 on each
# CPU of AARCH64_ISAS (-O3).
TARGETS = [pytest.param(("x86-64", "-O3"), id="x86-64-O3"), pytest.param(("x86-64", "-O0"), id="x86-64-O0"),
           *(pytest.param(("aarch64", cpu), id=cpu) for cpu in AARCH64_ISAS)]


def cases_match(source: str, cases: int, target: tuple[str, str]) -> None:
    """tests/cpp/`source` on `target` (one of TARGETS) matched `cases` cases on each ISA it has:
    on x86-64 at least the baseline and AVX2 (the CI machines have AVX2), `cases` on AVX2; under
    qemu exactly the baseline and the CPU's AARCH64_ISAS, in order."""
    arch, how = target
    if arch == "x86-64":
        checked, out = x86_isas_checked(source, how)
        assert {"baseline", "avx2"} <= checked, out
        assert f"isa avx2: {cases} cases match" in out.splitlines(), out
        return
    out = run(qemu_aarch64(how, build(source, "aarch64-linux-gnu-g++", "-static")))
    assert out.splitlines() == [f"isa {isa}: {cases} cases match" for isa in ["baseline", *AARCH64_ISAS[how]]], out
