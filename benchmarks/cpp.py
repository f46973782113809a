"""Latency as a C++ app sees it: the model zoo through `etfuse_runner` (executorch's Module API,
etfuse::kernels + executorch::kernels_optimized + kernels_quantized + the XNNPACK delegate, all
linked into one binary built with etfuse's CMake package), four programs per model, 1 and 2
threads.

    python benchmarks/cpp.py [--models resnet8,ds_cnn,...] [--threads 1,2] [--rounds 3]
                             [--iterations 20] [--build-dir DIR] [--programs etfuse,xnnpack,...]
                             [--baseline REV]

Programs (benchmarks/models.py's `lowered`): stock (portable ops on executorch::kernels_optimized),
etfuse, XNNPACK, XNNPACK + etfuse. Each round runs every program once per thread count, in turn
(interleaved, so load drifts hit all alike); a run is one runner process that reports the median
of --iterations forwards after one warm-up; the table gives the median over rounds and ratios
against XNNPACK at the same thread count. Prints the machine's load before and after.

`--baseline REV` adds the program `etfuse@REV`: the same etfuse `.pte` on a second runner built
from the kernels of git revision REV (`git archive REV kernels`), timed in the same rounds, so a
kernel change shows as the ratio etfuse / etfuse@REV on identical programs. The `.pte` must only
call ops that REV's library registers.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models as zoo  # noqa: E402  (benchmarks/models.py: the zoo and its lowering)

import torch  # noqa: E402

import etfuse.kernels  # noqa: E402

PROGRAMS = ("stock", "etfuse", "xnnpack", "xnnpack+etfuse")
_CONSUMER = """\
cmake_minimum_required(VERSION 3.28)
project(bench LANGUAGES CXX)
find_package(executorch CONFIG REQUIRED)
find_package(etfuse CONFIG REQUIRED)
"""


def build_runner(build_dir: Path, executorch_cmake: Path = None, cmake_args: tuple = (),
                 etfuse_cmake: str = None) -> Path:
    """etfuse_runner from the package (-DETFUSE_BUILD_RUNNER=ON), Release, built once per folder,
    against this Python's executorch package or the one at `executorch_cmake` (another platform's
    SDK, with its toolchain file in `cmake_args`), and this etfuse's kernels or the CMake package
    at `etfuse_cmake`."""
    import executorch

    et_cmake = executorch_cmake or next(Path(p) / "share" / "cmake" for p in executorch.__path__
                                        if (Path(p) / "share" / "cmake").is_dir())
    src = build_dir / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text(_CONSUMER)
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DETFUSE_BUILD_RUNNER=ON", f"-DCMAKE_PREFIX_PATH={etfuse_cmake or etfuse.kernels.cmake_prefix_path};{et_cmake}",
                    *cmake_args],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir / "build"), "-j2", "--target", "etfuse_runner"], check=True,
                   stdout=subprocess.DEVNULL)
    return build_dir / "build" / "etfuse_runner"


def baseline_runner(rev: str, build_dir: Path) -> Path:
    """etfuse_runner built from the kernels of git revision `rev` of this checkout."""
    repo = Path(__file__).resolve().parents[1]
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    src = build_dir / f"baseline-{sha}"
    if not (src / "kernels" / "cmake").is_dir():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(repo), "archive", sha, "kernels"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    return build_runner(src / "runner", etfuse_cmake=str(src / "kernels" / "cmake"))


def runner_ms(runner: Path, pte: Path, inputs: list, threads: int, iterations: int, workdir: Path) -> float:
    """The runner's median ms per forward (its own timing: no process start, no program load)."""
    args = [str(runner), str(pte), "--iterations", str(iterations), "--warmup", "1", "--threads", str(threads)]
    for i, t in enumerate(inputs):
        path = workdir / f"input_{i}.bin"
        path.write_bytes(t.contiguous().numpy().tobytes())
        args += ["--input", str(path)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{pte.name}: {out.stderr.strip()}")
    return float(re.search(r"median=([0-9.]+)", out.stdout).group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(zoo.ZOO))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "etfuse-bench-runner"))
    ap.add_argument("--programs", default=",".join(PROGRAMS), help=f"which of {list(PROGRAMS)} to time")
    ap.add_argument("--baseline", metavar="REV", help="also time the etfuse .pte on REV's kernels")
    args = ap.parse_args(argv)
    programs = [p for p in args.programs.split(",") if p]
    if set(programs) - set(PROGRAMS):
        ap.error(f"unknown programs {sorted(set(programs) - set(PROGRAMS))}; choose from {list(PROGRAMS)}")
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in zoo.ZOO]
    if unknown:
        ap.error(f"unknown models {unknown}; the zoo has {list(zoo.ZOO)}")
    threads = [int(t) for t in args.threads.split(",")]
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    runner = build_runner(Path(args.build_dir))
    runners = {p: runner for p in programs}
    if args.baseline:
        runners[f"etfuse@{args.baseline}"] = baseline_runner(args.baseline, Path(args.build_dir))
    etfuse.kernels.load()  # `lowered` checks each program loads on the Python runtime
    rows = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for name in names:
            torch.manual_seed(0)
            model, shape = zoo.ZOO[name]()
            model = zoo.eval_with_bn_stats(model)
            x = torch.randn(shape)
            lowered, _ = zoo.lowered(model, (x,), work, name, with_stock="stock" in programs)
            paths = zoo.pte_paths(lowered, work, name)
            times = {(p, t): [] for p in runners for t in threads}
            for _ in range(args.rounds):
                for t in threads:
                    for p, run in runners.items():
                        pte = paths[p.split("@")[0]]
                        times[p, t].append(runner_ms(run, pte, [x], t, args.iterations, work))
            for t in threads:
                rows.append((name, t, {p: statistics.median(times[p, t]) for p in runners}))
            print(f"{name}: done", file=sys.stderr, flush=True)
    ratios = [(a, b) for a, b in (("etfuse", "xnnpack"), ("xnnpack+etfuse", "xnnpack"), ("stock", "etfuse"),
                                  ("etfuse", f"etfuse@{args.baseline}")) if a in runners and b in runners]
    print("\n| model | threads | " + " | ".join(f"{p} ms" for p in runners) + "".join(f" | {a} / {b}" for a, b in ratios)
          + " |")
    print("|---|---:|" + "---:|" * (len(runners) + len(ratios)))
    for name, t, med in rows:
        print(f"| {name} | {t} | " + " | ".join(f"{med[p]:.3f}" for p in runners)
              + "".join(f" | {med[a] / med[b]:.3f}" for a, b in ratios) + " |")
    print(f"\nload after: {os.getloadavg()[0]:.2f}; runner: {runner}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
