"""Fuzz etfuse with random models: the generator of tests/test_fuzz.py, many more graphs.

    python benchmarks/fuzz.py --graphs 10000 [--seed 0] [--timeout 300] [--jobs 1] [--failures FILE]
    python benchmarks/fuzz.py --shrink 39 [--seed 0]      # graph 39 shrunk to a minimal model
    python benchmarks/fuzz.py ... --deadline 840           # start no graph after 840 s (resume: --start)
    python benchmarks/fuzz.py ... --results R.jsonl        # every graph's result; rerun to resume

With --results every graph's result is appended to the file with the code's fingerprint (a hash of
etfuse's sources and the generator, FINGERPRINTED): a rerun skips the graphs already there and its
summary counts them, so one run of 10,000 graphs can span sittings, on one code only (a file from
another code is refused).

At the end of a run every etfuse failure (mismatch, error, unstable) is shrunk in its own process
(`fuzz_models.shrink`: ops, body ops, outputs, seed removed while the same comparison fails) and
written as `repro_<seed>_<i>.py` next to --failures (or --repro-dir): a standalone script that
rebuilds the minimal model and exits 1 while the failure is there. The summary counts graphs per
rule family (from `FusionPass.report`) and outcome, the rules never fired, the passes that changed
a graph, and int8 graphs whose fused runtime equals the stock int8 runtime bit for bit.

Since issue 44 the generator draws the building blocks of tests/fuzz_blocks.py (every rule family,
every pass; tests/test_fuzz_coverage.py) and rank-3 main shapes and strided / channels-last
inputs, so graph i of a seed is not the graph i of the runs below (those used the elementwise /
linear / conv generator). First run at the new generator, 2 shared cores beside other jobs:
`python benchmarks/fuzz.py --graphs 300 --seed 44 --timeout 300 --jobs 2 --deadline 840
--failures F`: 300 graphs in 675 s (2.25 s/graph): pass 243, etfuse mismatches 2 (graph 149: a
KV-cache write into a copy; graph 248: an 8-bit group embedding whose q - zp wraps in int8),
etfuse unstable 1 (graph 68: fuse is not idempotent, CSE before UnitDimViewsPass), etfuse errors 0,
stock bugs 8 (all right in the fused program), stock errors 43 (28 + 9: the stock runtime has no
dequantize_affine / dequantize_per_channel_group kernel), skipped 3, aborts 0, hangs 0; 119 of 206
rules fired; int8 graphs bit-exact with the stock int8 runtime 35 of 35. Reproducers: the strict
xfails in tests/test_fuzz.py. At that rate 10,000 graphs take ~6.3 h with --jobs 2.

Since the QuantGemm / SymShape blocks, dynamic batches, blocks in while / scan bodies and the routes
check (one graph in four also through `edge.transform(default_passes())` and
`to_executorch(ExecutorchBackendConfig(passes=default_passes()))`), graph i differs again. First run
there, 2 shared cores beside another engineer's builds: `--graphs 400 --seed 46 --timeout 300 --jobs 2
--deadline 540`: 275 graphs in 551 s (2.0 s/graph): pass 220, etfuse mismatches / errors / unstable /
routes 0, stock bugs 7 (6 right in the fused program), stock errors 41 (31 no dequantize_affine /
dequantize_per_channel_group kernel, 8 strided inputs), skipped 7, aborts 0, hangs 0; 112 of 206 rules
fired; 16 dynamic batches (at the 25% draw), 82 routes-checked, 33 with blocks in loop bodies. The
routes check's two etfuse bugs came from the coverage sample (tests/test_fuzz.py: a loop whose
carry reads a parameter, fixed; group embeddings with zero points on the config route, strict xfail).

Graph i is `fuzz_models.generate(RandomDraw(random.Random(f"{seed}-{i}")))`, checked four ways
(eager, fused eager module, unfused runtime, fused runtime; see tests/fuzz_models.py). Graphs run in
worker subprocesses (one per job, reused across graphs): a worker that dies is an abort, one that
takes longer than --timeout seconds on a graph is killed and counted as a hang; a fresh worker
goes on with the next graph. Cumulative counts are printed every --every graphs and at the end;
etfuse failures, aborts and hangs are written with their model to --failures (JSON lines).

Run at a4f379f (same generator as now), 1 job, 2 cores shared with three other engineers:
`python benchmarks/fuzz.py --graphs 10000 --seed 0 --timeout 300 --jobs 1 --failures F`, stopped
at the deadline after 700 graphs in 4502 s (6.4 s/graph): pass 665, etfuse mismatches 0,
etfuse errors 0, known etfuse bug 17 (LoopLoweringPass under grad mode: `outs_to_grad length`),
stock-runtime bugs 17 (13 fixed by the fused program: a cond result overwritten by later control
flow; 4 wrong on both: a cond result read through a view, e.g. nn.Linear on a 4-D tensor), stock
error 1 (unfused runtime: "Guard shape_dynamism_eq_base failed"), skipped 0, aborts 0, hangs 0.
246 of the 700 graphs held a backend op (linear_act 170, quantized add 49, conv2d_act 48,
add_relu 25, linear_relu 14, quantized add_relu 12).

Continued at d1cf1c8 on idle CPU (nice 19, beside three other jobs), graphs 700-2599:
`nice -n 19 python benchmarks/fuzz.py --graphs 9300 --start 700 --seed 0 --timeout 600 --jobs 1`,
stopped at the session's end after 1900 graphs in 7338 s (3.9 s/graph): pass 1852, etfuse
mismatches 0, etfuse errors 0, known etfuse bugs 0, stock-runtime bugs 38, stock errors 10, skipped
0, aborts 0, hangs 0. Then at f450dd0 (after the issue-11 rework), quiet machine, `--start 2600 --jobs 2`:
500 graphs in 689 s (1.38 s/graph): pass 492, etfuse mismatches/errors 0, stock bugs 7, stock error 1,
aborts 0, hangs 0. Then at 1e8a788, nice 19 beside two helpers' builds and tests, graphs
3100-5599 (`--graphs 6900 --start 3100 --timeout 600 --jobs 2`, stopped for the session's CI dry run
after 2500 graphs in 7503 s, 3.0 s/graph): pass 2430, etfuse mismatches 0, etfuse errors 0, known
etfuse bugs 0, stock-runtime bugs 59, stock errors 11, skipped 0, aborts 0, hangs 0. Then at
12a66c4 (after issue 12), quiet machine, `--start 5600 --timeout 300 --jobs 2`: 800 graphs in 1118 s
(1.40 s/graph): pass 785, etfuse mismatches/errors 0, stock bugs 11, stock errors 4, aborts 0, hangs 0.
Then at 65cc646, `--graphs 3600 --start 6400 --timeout 300 --jobs 2`, beside CI dry runs and
benchmarks (load 2-5), graphs 6400-9999 in 8500 s (2.36 s/graph): pass 3526, etfuse mismatches 0,
etfuse errors 0, known etfuse bugs 0, stock-runtime bugs 69 (all fixed by the fused program),
stock errors 5, skipped 0, aborts 0, hangs 0.

All 10,000 graphs (seed 0, graphs 0-9999): pass 9750, etfuse mismatches 0, etfuse errors 0,
aborts 0, hangs 0; known etfuse bug 17 (graphs 0-699 only, at a4f379f; fixed since, 0 after);
stock-runtime bugs 201 (wrong results of the unfused stock program; in the first 700 graphs 4 were
wrong in the fused program too, a cond result read through a view, fixed since; in the last 3,600
the fused program matched eager on all 69); stock errors 32. The generator draws no pooling, SiLU, sigmoid or GELU, so the rules added
after 65cc646 are covered by their own tests (tests/test_pooling.py, tests/test_gemm_conv.py), not here.

Issue 44's run (seed 44, the building blocks, every 12th graph also on aarch64 under qemu):
`--graphs 10000 --seed 44 --timeout 300 --jobs 2 --every 100 --aarch64-every 12 --results R`.
Runs at earlier codes found etfuse bugs at graphs 357 and 613 (config route, int32 affine zero
points), 2085 and 2702 (fuse twice != once), 2270, 2329 and 3069 (a cache write into a copy,
wrong on the runtime) and 2770 (a cond no longer retraceable), and mislabelled 2551 (a stock
bug); each fixed with a test. At code 577be2473500118e (after those fixes), Zen 4, 2 cores, nothing
else running: graphs 0-2714 (and a few past) at ~0.93 s/graph: pass 2194, etfuse mismatches /
errors / unstable / routes / aarch64 0, stock bugs 48 (44 right in the fused program), stock
errors 442, skipped 31, aborts 0, hangs 0; 180 graphs on aarch64; 373 int8 graphs bit-exact with
the stock int8 runtime; 185 of 209 rules fired. Resumed there (2 jobs, 1 from graph 7500) up to
graph 7738: pass 6264, stock bugs 105, stock errors 1269, skipped 100, aborts / hangs 0, 519 graphs
on aarch64, 1111 int8 graphs bit-exact; one etfuse error, graph 7361 (a cond copy of a transposed
result, dim order [1, 0], which executorch cannot lower: fixed in 6573dc5 with a test). The results
are benchmarks/fuzz_runs/seed44-577be2473500118e.jsonl.gz; with the fix the code's fingerprint
changed, so the run starts again from graph 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

MARK = "@@FUZZ "


def spec_for(seed: int, i: int):
    import fuzz_models as fm

    return fm.generate(fm.RandomDraw(random.Random(f"{seed}-{i}")))


def aarch64_runner(cpu: str) -> list:
    """The command that runs the README's C++ app (etfuse_runner) built for aarch64, under qemu."""
    import readme_consumer

    return ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, str(readme_consumer.app("aarch64"))]


def cache_cia_ops() -> None:
    """In a worker: torch's run_decompositions (to_edge, retracing, PT2E) walks every op of every
    namespace for the CompositeImplicitAutograd ones twice a call (0.05-0.1 s each, a tenth or more
    of a graph here); the set changes only when ops are registered, so keep it per registry."""
    import torch
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    collect, cache = export_utils._collect_all_valid_cia_ops, {}

    def cached():
        key = (tuple(torch.ops._dir), len(torch._C._dispatch_get_all_op_names()))
        if key not in cache:
            cache[key] = collect()
        return cache[key]

    for module in (export_utils, decomp_utils, exported_program):
        module._collect_all_valid_cia_ops = cached


def worker(seed: int, aarch64_every: int = 0, aarch64_cpu: str = "neoverse-n1") -> None:
    """Read graph indices from stdin, write one result line per graph to stdout. Graphs whose index
    is a multiple of `aarch64_every` also run on the aarch64 runner."""
    import warnings

    warnings.filterwarnings("ignore")
    import fuzz_models as fm

    fm.kernels()
    cache_cia_ops()
    runner = aarch64_runner(aarch64_cpu) if aarch64_every else None
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed stays out of the result stream
    out.write(MARK + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        i = int(line)
        t = time.time()
        try:
            o = fm.check(spec_for(seed, i), aarch64=runner if aarch64_every and i % aarch64_every == 0 else None)
            res = {"i": i, "kind": o.kind, "detail": o.detail[:4000], "error": o.error,
                   "fused_ok": o.fused_ok, "fused_ops": o.fused_ops, "rules": o.rules, "passes": o.passes,
                   "int8_exact": o.int8_exact, "aarch64": o.aarch64}
        except Exception as e:  # noqa: BLE001  (a bug in the harness itself)
            res = {"i": i, "kind": "harness_error", "detail": repr(e)[:2000], "error": fm._err(e)}
        res["s"] = round(time.time() - t, 3)
        out.write(MARK + json.dumps(res) + "\n")
        out.flush()


def shrink(seed: int, i: int, repro_dir=None, aarch64_cpu: str = "neoverse-n1") -> int:
    """Check graph i, shrink it to a minimal model with the same outcome (kind, error and whether
    the fused runtime was right), and with `repro_dir` write `repro_<seed>_<i>.py` there: a
    standalone script that rebuilds the minimal model and exits 1 while the failure is there."""
    import warnings

    warnings.filterwarnings("ignore")
    import fuzz_models as fm

    fm.kernels()
    spec = spec_for(seed, i)
    first = fm.check(spec)
    runner = None
    if first.kind == fm.PASS:  # an aarch64 failure shows only there
        runner = aarch64_runner(aarch64_cpu)
        first = fm.check(spec, aarch64=runner)
    print(f"graph {i}: {first}\n{spec!r}", flush=True)
    if first.kind == fm.PASS:
        return 0
    routes = True if first.kind == fm.ETFUSE_ROUTES else None  # a smaller model is checked on every route too

    def same(s):
        # the same kind, error and comparison that failed ("fused runtime vs eager", ...): a shrink
        # that drifts to another failure of the same kind is not taken
        o = fm.check(s, routes=routes, aarch64=runner)
        return (o.kind == first.kind and o.fused_ok == first.fused_ok and o.error == first.error
                and o.detail.split("(")[0] == first.detail.split("(")[0])

    small = fm.shrink(spec, same, log=lambda m: print(m, flush=True))
    outcome = fm.check(small, routes=routes, aarch64=runner)
    print(f"minimal:\n{small!r}\n{outcome}", flush=True)
    if repro_dir is not None:
        path = Path(repro_dir) / f"repro_{seed}_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)  # shrinking takes minutes: not lost to a missing folder
        path.write_text(fm.reproducer(small, outcome, f"graph {i} of seed {seed}, shrunk from {len(spec.ops)} to "
                                                      f"{len(small.ops)} ops", aarch64=runner))
        print(f"reproducer: {path}", flush=True)
    return 0


ROOT = TESTS.parent
# what decides a graph's outcome: etfuse itself (ops, rules, passes, kernels, the runner) and the
# generator; a results file holds graphs of one fingerprint only ("10,000 graphs on the final code")
FINGERPRINTED = ("src/etfuse", "backend_ops", "patterns", "passes", "kernels", "tests/fuzz_models.py",
                 "tests/fuzz_blocks.py", "tests/readme_consumer.py", "tests/deploy_models.py", "pyproject.toml")
_SOURCE_SUFFIXES = {".py", ".h", ".hpp", ".c", ".cc", ".cpp", ".txt", ".cmake", ".in", ".toml", ".json"}


def code_fingerprint(root: Path = ROOT) -> str:
    """A short hash of the FINGERPRINTED sources' paths and contents (build outputs and caches left out)."""
    import hashlib

    h = hashlib.sha256()
    for top in FINGERPRINTED:
        base = root / top
        for f in [base] if base.is_file() else _source_files(base):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _source_files(base: Path) -> list[Path]:
    """The source files under base, sorted (build outputs and caches left out)."""
    return sorted(f for f in base.rglob("*") if f.is_file() and f.suffix in _SOURCE_SUFFIXES
                  and "__pycache__" not in f.parts and "build" not in f.parts)


# each fingerprinted package as the checkout holds it and as `import etfuse` finds it
_PACKAGES = (("src/etfuse", "etfuse"), ("backend_ops", "etfuse.backend_ops"), ("patterns", "etfuse.patterns"),
             ("passes", "etfuse.passes"), ("kernels", "etfuse.kernels"))


def stale_install(root: Path = ROOT) -> list[str]:
    """The checkout's source files that the imported etfuse lacks or holds otherwise: a
    non-editable install of older code would be fuzzed under this checkout's fingerprint."""
    import importlib

    stale = []
    for top, module in _PACKAGES:
        installed = Path(importlib.import_module(module).__file__).parent
        for f in _source_files(root / top):
            copy = installed / f.relative_to(root / top)
            if not copy.is_file() or copy.read_bytes() != f.read_bytes():
                stale.append(str(f.relative_to(root)))
    return stale


def read_results(path: str, code: str) -> dict:
    """{graph index: result} from a --results file, every line checked at `code`; SystemExit naming
    the file and both fingerprints when it holds another code's graphs."""
    done = {}
    if not Path(path).exists():
        return done
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            res = json.loads(line)
            if res.get("code") != code:
                raise SystemExit(f"{path}:{n}: graph {res.get('i')} was checked at code {res.get('code')}, this "
                                 f"checkout is {code} (benchmarks/fuzz.py FINGERPRINTED changed): a run counts "
                                 "graphs of one code only; start a new --results file")
            done[res["i"]] = res
    return done


def rule_families() -> dict:
    """{rule key: family} from etfuse.patterns' family lists."""
    import etfuse.patterns as P

    families = {}
    for name in ("QUANTIZED_ADD_RULES", "EMBEDDING_RULES", "QUANTIZED_GEMM_RULES", "GEMM_CONV_RULES",
                 "WEIGHT_ONLY_RULES", "DYNAMIC_QUANT_RULES", "LINEAR_RANK_RULES", "LINEAR_RESIDUAL_RULES", "CONV_RESIDUAL_RULES",
                 "POOL_RULES", "ATTENTION_RULES", "NORM_RULES", "CACHE_RULES", "ROPE_RULES", "LAYOUT_RULES",
                 "FLOAT_RULES"):
        for r in getattr(P, name):
            families.setdefault(r.key, name[: -len("_RULES")].lower())
    return families


class Worker:
    def __init__(self, seed: int, startup_timeout: float, extra: tuple = ()):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--seed", str(seed), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1,
            start_new_session=True,
        )
        if self.read(startup_timeout) is None:
            raise RuntimeError(f"fuzz worker did not start: {self.stderr_tail()}")

    def read(self, timeout: float):
        """The next result, or None on EOF (worker died); raises TimeoutError."""
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if not r:
                continue
            line = self.proc.stdout.readline()
            if not line:
                return None
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def run(self, i: int, timeout: float):
        self.proc.stdin.write(f"{i}\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def stderr_tail(self, n: int = 1500) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-n:]

    def close(self):
        """Ends the worker (it exits at the end of its input) and waits for it."""
        self.proc.stdin.close()
        self.proc.wait()

    def kill(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first graph index (resume a run)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per graph before it is a hang")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds: start no graph after this (the summary still prints); resume with --start")
    ap.add_argument("--every", type=int, default=25, help="print cumulative counts every N graphs")
    ap.add_argument("--failures", default=None, help="JSON-lines file for failures, aborts and hangs")
    ap.add_argument("--results", default=None,
                    help="JSON-lines file of every graph's result, with the code fingerprint: graphs already in it "
                         "are not run again and count in the summary (resume a run, across sessions)")
    ap.add_argument("--shrink", type=int, default=None, metavar="I",
                    help="check graph I of --seed in this process and shrink it to a minimal model "
                         "with the same outcome")
    ap.add_argument("--repro-dir", default=None,
                    help="where reproducers go (default: next to --failures, else the current directory)")
    ap.add_argument("--no-shrink", action="store_true",
                    help="do not shrink the etfuse failures at the end of the run")
    ap.add_argument("--shrink-timeout", type=float, default=1800.0, help="seconds per failure shrink")
    ap.add_argument("--aarch64-every", type=int, default=0, metavar="K",
                    help="every K-th graph also through the C++ runner built for aarch64, under qemu-aarch64")
    ap.add_argument("--aarch64-cpu", default="neoverse-n1", help="qemu -cpu for --aarch64-every")
    ap.add_argument("--recycle", type=int, default=200, metavar="N",
                    help="start a fresh worker after N graphs (0: never); a worker's heap grows with every graph "
                         "(3.5 GB after 2,000) and its graphs slow down by half")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.seed, a.aarch64_every, a.aarch64_cpu)
        return 0
    repro_dir = a.repro_dir or (str(Path(a.failures).resolve().parent) if a.failures else ".")
    if a.shrink is not None:
        return shrink(a.seed, a.shrink, repro_dir, a.aarch64_cpu)
    import fuzz_models as fm

    if a.aarch64_every:
        aarch64_runner(a.aarch64_cpu)  # built once here, before the workers ask for it

    counts = collections.Counter()
    errors = collections.Counter()
    fused = collections.Counter()  # backend ops in the fused programs, summed
    families = rule_families()
    by_family = collections.Counter()  # (family, outcome kind) -> graphs in which a rule of it fired
    by_rule = collections.Counter()  # rule key -> graphs in which it fired
    by_pass = collections.Counter()  # pass -> graphs it changed
    failed = []
    lock = threading.Lock()
    code = code_fingerprint()
    stale = stale_install()
    if stale:
        raise SystemExit(f"the imported etfuse is not this checkout: {len(stale)} files differ or are missing (e.g. "
                         f"{', '.join(stale[:3])}); `pip install -e .` it first")
    earlier = read_results(a.results, code) if a.results else {}
    results = open(a.results, "a") if a.results else None
    todo = queue.Queue()
    for i in range(a.start, a.start + a.graphs):
        if i not in earlier:
            todo.put(i)
    failures = open(a.failures, "a") if a.failures else None
    print(f"code {code}; {len(earlier)} graphs from {a.results}, {todo.qsize()} to run" if a.results
          else f"code {code}", flush=True)
    t0 = time.time()
    done = [0]
    ran = [0]

    def report(final=False):
        el = time.time() - t0
        line = (f"[{'final' if final else 'progress'}] graphs={done[0]}/{a.graphs} "
                + " ".join(f"{k}={counts[k]}" for k in
                           ("pass", *fm.FAILURES, "known_etfuse_bug", "stock_bug",
                            "stock_error", "skip", "abort", "hang", "harness_error"))
                + f" aarch64={counts['aarch64']}"
                + f" time={el:.0f}s ({el / max(ran[0], 1):.2f}s/graph run here)")
        print(line, flush=True)
        if final or done[0] % (a.every * 4) == 0:
            print(f"    graphs with a fused op: {counts['with_fusion']}; fused ops: "
                  + ", ".join(f"{k} {v}" for k, v in fused.most_common()), flush=True)
        if final or done[0] % (a.every * 4) == 0:
            for k, v in errors.most_common(12):
                print(f"    {v:6d}  {k}", flush=True)

    def record(i, res, earlier=False):
        with lock:
            done[0] += 1
            if not earlier:
                ran[0] += 1
                if results:
                    keep = {k: v for k, v in res.items() if k != "detail" or res["kind"] != "pass"}
                    results.write(json.dumps({**keep, "i": i, "code": code}) + "\n")
                    results.flush()
            counts[res["kind"]] += 1
            ops = res.get("fused_ops") or {}
            counts["with_fusion"] += bool(ops)
            fused.update(ops)
            rules = res.get("rules") or {}
            by_rule.update(rules.keys())
            for fam in {families.get(k, "?") for k in rules}:
                by_family[(fam, res["kind"])] += 1
            by_pass.update(res.get("passes") or ())
            counts["aarch64"] += bool(res.get("aarch64"))
            if res.get("int8_exact") is not None:
                counts["int8_exact" if res["int8_exact"] else "int8_within_a_step"] += 1
            if res["kind"] in fm.FAILURES:
                if not earlier:
                    failed.append(i)
            if res.get("error") and res["kind"] != "pass":
                errors[f"{res['kind']}: {res['error'][:140]}"] += 1
            if res["kind"] == "stock_bug":
                counts["stock_bug_fused_ok" if res.get("fused_ok") else "stock_bug_fused_wrong"] += 1
            if not earlier and res["kind"] in (*fm.FAILURES, "abort", "hang", "harness_error", "stock_bug",
                                               "known_etfuse_bug"):
                spec = repr(spec_for(a.seed, i))
                print(f"--- graph {i}: {res['kind']}: {res['detail'][:600]}\n{spec}", flush=True)
                if failures:
                    failures.write(json.dumps({**res, "i": i, "seed": a.seed, "spec": spec}) + "\n")
                    failures.flush()
            if not earlier and done[0] % a.every == 0:
                report()

    for i in sorted(earlier):
        if a.start <= i < a.start + a.graphs:
            record(i, earlier[i], earlier=True)

    def job():
        w, ran_here = None, 0
        while True:
            if a.deadline is not None and time.time() - t0 > a.deadline:
                break
            try:
                i = todo.get_nowait()
            except queue.Empty:
                break
            if w is not None and a.recycle and ran_here >= a.recycle:
                w.close()  # a fresh process: a long-lived worker's heap slows it down
                w = None
            if w is None:
                w = Worker(a.seed, startup_timeout=600,
                           extra=("--aarch64-every", str(a.aarch64_every), "--aarch64-cpu", a.aarch64_cpu))
                ran_here = 0
            ran_here += 1
            try:
                res = w.run(i, a.timeout)
            except TimeoutError:
                w.kill()
                w = None
                res = {"kind": "hang", "detail": f"no result in {a.timeout:.0f}s"}
            except BrokenPipeError:
                res = None
            if res is None and w is not None:
                w.proc.wait()
                res = {"kind": "abort", "detail": f"worker exited {w.proc.returncode}: {w.stderr_tail(600)}",
                       "error": f"exit {w.proc.returncode}"}
                w = None
            record(i, res)
        if w is not None:
            w.close()

    threads = [threading.Thread(target=job) for _ in range(max(1, a.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report(final=True)
    print(f"stock bugs where the fused runtime matched eager: {counts['stock_bug_fused_ok']}, "
          f"where it was wrong too: {counts['stock_bug_fused_wrong']}", flush=True)
    print(f"int8 graphs whose fused runtime equals the stock int8 runtime bit for bit: {counts['int8_exact']}, "
          f"within one step: {counts['int8_within_a_step']}", flush=True)
    kinds = sorted({k for _, k in by_family})
    print("graphs per rule family (a rule of it fired) and outcome:", flush=True)
    for fam in sorted({f for f, _ in by_family}):
        print(f"    {fam:16s} " + " ".join(f"{k}={by_family[(fam, k)]}" for k in kinds if by_family[(fam, k)]), flush=True)
    all_rules = set(families)
    never = sorted(all_rules - set(by_rule))
    print(f"rules fired: {len(set(by_rule) & all_rules)}/{len(all_rules)}; never: "
          + (f"{never}" if len(never) <= 40 else f"{len(never)} rules"), flush=True)
    print("graphs each rule fired in: " + ", ".join(f"{k} {v}" for k, v in sorted(by_rule.items())), flush=True)
    print("graphs each pass changed: " + ", ".join(f"{k} {v}" for k, v in by_pass.most_common()), flush=True)
    if failed and not a.no_shrink:
        for i in failed:  # each in its own process: a shrink that aborts or hangs costs only itself
            print(f"shrinking graph {i} (reproducer in {repro_dir})", flush=True)
            try:
                subprocess.run([sys.executable, __file__, "--seed", str(a.seed), "--shrink", str(i),
                                "--repro-dir", repro_dir], timeout=a.shrink_timeout, check=False)
            except subprocess.TimeoutExpired:
                print(f"    shrinking graph {i} timed out after {a.shrink_timeout:.0f}s", flush=True)
    return 1 if any(counts[k] for k in (*fm.FAILURES, "abort", "hang")) else 0


if __name__ == "__main__":
    sys.exit(main())
