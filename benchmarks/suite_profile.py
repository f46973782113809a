"""Where the test suite's time goes, in CPU seconds: load-independent, so it can be measured beside
other work on a shared machine (wall time there says little).

    python benchmarks/suite_profile.py [--out profile.jsonl] [--top 40] [pytest args, default: tests]
    python benchmarks/suite_profile.py --report profile.jsonl       # the tables of an earlier run

Runs pytest in one process (no xdist) with a plugin that records, per test, the CPU time of this
process and of the children it waited for (compilers, qemu, CMake, subprocess checks), setup +
call + teardown, and the wall time beside it; then prints the modules and the tests by CPU time.
A module fixture's cost lands on the module's first test. Half the total is about the suite's
wall time under the README's `-n 2 --dist loadscope` on 2 idle cores, when no module outlasts the
rest.
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuTimes:
    """The pytest plugin: one JSON line per test, {"id", "cpu", "wall"}."""

    def __init__(self, out: Path):
        self.out = out

    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ARG002 (pytest's hook signature)
        self._start = (cpu_seconds(), time.perf_counter())

    def pytest_runtest_logfinish(self, nodeid, location):  # noqa: ARG002
        cpu0, wall0 = self._start
        with open(self.out, "a") as f:
            f.write(json.dumps({"id": nodeid, "cpu": round(cpu_seconds() - cpu0, 2),
                                "wall": round(time.perf_counter() - wall0, 2)}) + "\n")


def report(path: Path, top: int) -> None:
    rows = [json.loads(line) for line in open(path)]
    total = sum(r["cpu"] for r in rows)
    modules = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = modules[r["id"].split("::")[0]]
        m[0] += r["cpu"]
        m[1] += r["wall"]
        m[2] += 1
    print(f"{len(rows)} tests: {total:.0f} CPU s, {sum(r['wall'] for r in rows):.0f} wall s "
          f"(~{total / 2 / 60:.1f} min on 2 idle cores)\n")
    print("| module | tests | CPU s | share | wall s |\n|---|---:|---:|---:|---:|")
    for name, (cpu, wall, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {n} | {cpu:.1f} | {100 * cpu / total:.1f}% | {wall:.1f} |")
    print("\n| test | CPU s | wall s |\n|---|---:|---:|")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"| {r['id']} | {r['cpu']:.1f} | {r['wall']:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("suite_profile.jsonl"), help="the per-test JSON lines")
    ap.add_argument("--report", type=Path, help="print the tables of an earlier --out file and stop")
    ap.add_argument("--top", type=int, default=40)
    a, pytest_args = ap.parse_known_args(argv)
    if a.report:
        report(a.report, a.top)
        return 0
    import pytest

    a.out.unlink(missing_ok=True)
    status = pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", *(pytest_args or [str(ROOT / "tests")])],
                         plugins=[CpuTimes(a.out)])
    report(a.out, a.top)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
