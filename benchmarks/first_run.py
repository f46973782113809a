"""What a new user waits for: `pip install . && etfuse demo` in a fresh virtual environment, with
empty kernel and pattern caches, timed end to end and in parts.

    python benchmarks/first_run.py [--venv /tmp/etfuse-first-run] [--keep]

Times, one after the other on the same machine (note its load: `uptime` is printed before and
after):

* `pip install .` into a new venv (torch from pip's wheel cache / find-links, as on CI);
* `etfuse demo` with empty caches: what the user sees (the runtime library compiles in the
  background while the demo exports and fuses, `etfuse.kernels.prepare()`);
* the parts, each again from empty caches: the runtime library's build alone
  (`etfuse.kernels.load()`), tracing the rule table alone (`FusionPass()`), and the demo with
  both caches warm;
* the stderr of the cold demo (it should be empty).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _timed(cmd: list[str], env: dict, cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return elapsed, proc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.path.join(tempfile.gettempdir(), "etfuse-first-run"))
    ap.add_argument("--keep", action="store_true", help="keep the venv and caches afterwards")
    args = ap.parse_args(argv)
    venv = Path(args.venv)
    shutil.rmtree(venv, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="etfuse-first-run-"))
    print("load before:", os.getloadavg())

    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install_s, _ = _timed([str(venv / "bin" / "pip"), "install", "-q", str(ROOT)], dict(os.environ), str(work))
    py, etfuse = str(venv / "bin" / "python"), str(venv / "bin" / "etfuse")

    def caches(tag: str) -> dict:
        return dict(os.environ, ETFUSE_KERNEL_CACHE=str(work / tag / "kernels"),
                    ETFUSE_PATTERN_CACHE=str(work / tag / "patterns"))

    demo_cold_s, demo = _timed([etfuse, "demo"], caches("cold"), str(work))
    total_s = time.perf_counter() - start
    build_s, _ = _timed([py, "-c", "import etfuse.kernels as k; k.load()"], caches("parts"), str(work))
    trace_s, _ = _timed([py, "-c", "from etfuse.passes import FusionPass; FusionPass()"], caches("parts"), str(work))
    demo_warm_s, _ = _timed([etfuse, "demo"], caches("parts"), str(work))

    print("\n| step | seconds |\n|---|---:|")
    print(f"| `pip install .` (new venv) | {install_s:.0f} |")
    print(f"| `etfuse demo`, empty caches (what the user waits for) | {demo_cold_s:.0f} |")
    print(f"| **total, venv to demo output** | **{total_s:.0f}** |")
    print(f"| parts: runtime library build alone | {build_s:.0f} |")
    print(f"| parts: tracing the rule table alone | {trace_s:.0f} |")
    print(f"| parts: `etfuse demo`, warm caches | {demo_warm_s:.0f} |")
    print("\ncold demo's stderr:", repr(demo.stderr) if demo.stderr else "(empty)")
    print("load after:", os.getloadavg(), f"cpus: {os.cpu_count()}")
    if not args.keep:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)  # the caches and the kernels' build folders
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
