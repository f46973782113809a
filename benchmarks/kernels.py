"""Benchmark the etfuse C++ kernels against the stock ExecuTorch runtime and torch eager.

    python benchmarks/kernels.py [--quick] [--reps N]

add_relu at 64K, 1M and 16M float32 elements, side by side in one run:

* fused      the .pte of relu(a + b) with the fused `etfuse::add_relu.out`, ExecuTorch runtime
* unfused    the .pte of the same model as exported: stock `aten::add.out` + `aten::relu.out`
* eager      torch eager `torch.relu(a + b)`
* probe      a STREAM-add loop (c = a + b: 2 reads + 1 write per element, the bytes add_relu
             moves), compiled with the same flags, split over the same ExecuTorch threadpool,
             one ctypes call per run (so it pays the same thread wake-up as a kernel call)

Runtime columns time `Method.execute()` on inputs set once beforehand (the whole method: the
instruction loop, kernel dispatch, out resizing, the kernel), called from Python. The
"call" columns time the user-facing `executorch.runtime` `Method.execute(inputs)`, which also
copies the inputs into the planned buffers and clones the outputs. Bandwidth counts 12 bytes
per element (two float reads, one float write) for every column.

linear_relu (nn.Linear + relu) at 64x256x256 and 256x512x512 (M x K x N), in GFLOP/s
(2*M*N*K / time): fused runtime, the stock runtime's permute_copy + addmm + relu chain,
torch eager, and the eager etfuse kernel (`torch.ops.etfuse.linear_relu.out`).

A last table repeats add_relu with the ExecuTorch threadpool reset to 1 and to 2 threads.

Variants are timed round-robin (batches of calls, interleaved) and the median batch is
reported, which keeps the comparison fair on a shared, noisy machine. The ExecuTorch variants
(and the probe, which runs on the same threadpool) form one group, torch eager another:
interleaving OpenMP and threadpool calls on 2 cores makes each wait for the other's spinning
threads. The "call" columns form a third group (their input copies, output clones and
allocations slow down whatever runs next).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import etfuse.backend_ops  # noqa: E402,F401
import etfuse.kernels as kernels  # noqa: E402


# ------------------------------------------------------------------------------------------
# programs


def fuse_pass():
    """etfuse's own float fusions (relu(add), relu(linear), relu(addmm))."""
    from etfuse.passes import FloatFusionPass

    return FloatFusionPass()


def make_method(model, args, fused: bool, workdir: Path, name: str):
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    edge = to_edge(torch.export.export(model, args))
    if fused:
        edge = edge.transform([fuse_pass()])
    et = edge.to_executorch()
    ops = [o.name + "." + o.overload for o in et.executorch_program.execution_plan[0].operators]
    path = workdir / f"{name}.pte"
    path.write_bytes(et.buffer)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    return method, ops


class AddRelu(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)


class LinearRelu(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.lin = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


# ------------------------------------------------------------------------------------------
# timing


def batch_size(fn, target_s: float) -> int:
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(10_000, int(target_s / one)))


def interleaved(variants: dict, rounds: int, target_s: float) -> dict:
    """Median seconds per call of each variant; variants run round-robin in batches.

    Runtime variants and torch eager variants are timed in separate groups: both thread pools
    spin for a while after a parallel region, and on 2 cores the spinning pool of one steals
    the core the other's worker needs."""
    time.sleep(0.2)  # let the other pool's spinning threads go to sleep
    sizes = {name: batch_size(v, target_s) for name, v in variants.items()}
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, v in variants.items():
            k = sizes[name]
            t0 = time.perf_counter()
            for _ in range(k):
                v()
            samples[name].append((time.perf_counter() - t0) / k)
    return {name: statistics.median(s) for name, s in samples.items()}


# One program in a fresh process: load the etfuse kernels and the program, warm up, then print
# the seconds per public `Method.execute(inputs)` (input copies and output clones included) of a
# batch of about target_s.
_ISOLATED_RUN = """
import sys, time, torch
import etfuse.kernels
from executorch.runtime import Runtime
# torch only copies the inputs and outputs here: its OpenMP workers, spinning after each copy,
# would take the second core from the program's own threads (a deployed program has no torch)
torch.set_num_threads(1)
etfuse.kernels.load()
pte, inputs, target_s = sys.argv[1], torch.load(sys.argv[2]), float(sys.argv[3])
method = Runtime.get().load_program(pte).load_method("forward")
for _ in range(3):
    method.execute(inputs)
t0 = time.perf_counter()
method.execute(inputs)
k = max(1, min(10_000, int(target_s / max(time.perf_counter() - t0, 1e-7))))
t0 = time.perf_counter()
for _ in range(k):
    method.execute(inputs)
print((time.perf_counter() - t0) / k)
"""


def isolated(programs: dict, inputs, rounds: int, target_s: float, workdir: Path) -> dict:
    """Median seconds per call of each `.pte` (name -> path), each timed alone in a new process,
    the programs taking turns round by round. In one process every loaded program shares the
    caches: MobileBERT's etfuse program ran 3.6 ms alone and 3.9-4.0 beside a second program."""
    inputs_path = workdir / "isolated_inputs.pt"
    torch.save(list(inputs), inputs_path)
    samples = {name: [] for name in programs}
    names = list(programs)
    for r in range(rounds):
        # each round starts one program later: a program's place in the round is no bias (two
        # byte-identical .pte, XNNPACK's and XNNPACK + etfuse's ResNet-18, measured 3.36 and
        # 3.75 ms when always timed second and third)
        for name in names[r % len(names):] + names[:r % len(names)]:
            path = programs[name]
            out = subprocess.run([sys.executable, "-c", _ISOLATED_RUN, str(path), str(inputs_path), str(target_s)],
                                 capture_output=True, text=True, check=True)
            samples[name].append(float(out.stdout.split()[-1]))
    return {name: statistics.median(s) for name, s in samples.items()}


def runtime_exec(method, inputs):
    """`Method.execute()` on inputs set once: the method's own execution time."""
    raw = method._method
    raw.set_inputs(list(inputs))
    return raw.execute


# ------------------------------------------------------------------------------------------


def bench_add_relu(sizes, rounds, workdir, probe):
    rows = []
    for n in sizes:
        a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
        fused, fused_ops = make_method(AddRelu(), (a, b), True, workdir, f"add_relu_fused_{n}")
        unfused, unfused_ops = make_method(AddRelu(), (a, b), False, workdir, f"add_relu_unfused_{n}")
        ref = torch.relu(a + b)
        assert torch.equal(fused.execute([a, b])[0], ref) and torch.equal(unfused.execute([a, b])[0], ref)
        target = 0.02 if n >= 1 << 24 else 0.005
        t = interleaved(
            {
                "fused": runtime_exec(fused, (a, b)),
                "unfused": runtime_exec(unfused, (a, b)),
                "probe": lambda: probe(a.data_ptr(), b.data_ptr(), c.data_ptr(), n, 1),
            },
            rounds,
            target,
        )
        t.update(
            interleaved(
                {"fused call": lambda: fused.execute([a, b]), "unfused call": lambda: unfused.execute([a, b])},
                rounds,
                target,
            )
        )
        t.update(interleaved({"eager": lambda: torch.relu(a + b)}, rounds, target))
        gbs = {k: 12 * n / v / 1e9 for k, v in t.items()}
        rows.append((n, t, gbs, fused_ops, unfused_ops))
    return rows


def bench_threads(sizes, rounds, workdir, probe):
    """add_relu with the ExecuTorch threadpool at 1 and at 2 threads."""
    from executorch.extension.pybindings import portable_lib

    default = portable_lib._threadpool_get_thread_count()
    rows = []
    try:
        for n in sizes:
            a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
            fused, _ = make_method(AddRelu(), (a, b), True, workdir, f"thr_fused_{n}")
            unfused, _ = make_method(AddRelu(), (a, b), False, workdir, f"thr_unfused_{n}")
            res = {}
            for threads in (1, 2):
                portable_lib._unsafe_reset_threadpool(threads)
                t = interleaved(
                    {
                        "fused": runtime_exec(fused, (a, b)),
                        "unfused": runtime_exec(unfused, (a, b)),
                        "probe": lambda: probe(a.data_ptr(), b.data_ptr(), c.data_ptr(), n, 1),
                    },
                    rounds,
                    0.01,
                )
                res[threads] = {k: 12 * n / v / 1e9 for k, v in t.items()}
            rows.append((n, res))
    finally:
        portable_lib._unsafe_reset_threadpool(default)
    return rows


def bench_linear(shapes, rounds, workdir):
    rows = []
    for m, k, n in shapes:
        model = LinearRelu(k, n).eval()
        x = torch.randn(m, k)
        fused, fused_ops = make_method(model, (x,), True, workdir, f"linear_fused_{m}_{k}_{n}")
        unfused, unfused_ops = make_method(model, (x,), False, workdir, f"linear_unfused_{m}_{k}_{n}")
        with torch.no_grad():
            ref = model(x)
        torch.testing.assert_close(fused.execute([x])[0], ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(unfused.execute([x])[0], ref, rtol=1e-4, atol=1e-4)
        w, bias = model.lin.weight.detach(), model.lin.bias.detach()
        out = torch.empty(m, n)

        def eager():
            with torch.no_grad():
                return model(x)

        t = interleaved({"fused": runtime_exec(fused, (x,)), "unfused": runtime_exec(unfused, (x,))}, rounds, 0.02)
        t.update(
            interleaved(
                {"eager": eager, "etfuse eager": lambda: torch.ops.etfuse.linear_relu.out(x, w, bias, out=out)},
                rounds,
                0.02,
            )
        )
        gf = {key: 2 * m * n * k / v / 1e9 for key, v in t.items()}
        rows.append(((m, k, n), t, gf, fused_ops, unfused_ops))
    return rows


def fmt_n(n):
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def load_probe():
    """The bandwidth probe from the benchmark-only library (built on demand, next to the kernel
    build; it shares the ExecuTorch threadpool with the runtime library)."""
    lib = ctypes.CDLL(str(kernels.build.probe_library()))
    fn = lib.etfuse_probe_stream_add
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    return fn


def us(s):
    return f"{s * 1e6:,.0f}" if s >= 1e-4 else f"{s * 1e6:.1f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (smoke test)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per variant (default 15)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)

    info = kernels.load(eager=True)
    probe = load_probe()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load_before = os.getloadavg()[0]
    print("# etfuse kernels benchmark\n")
    print(
        f"{cpu}, {os.cpu_count()} CPUs; torch {torch.__version__} ({torch.get_num_threads()} threads); "
        f"ExecuTorch threadpool {info.runtime_threads} threads; kernel ISA {info.isa}; {rounds} rounds, medians\n"
    )
    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        add_rows = bench_add_relu([1 << 16, 1 << 20, 1 << 24], rounds, workdir, probe)
        lin_rows = bench_linear([(64, 256, 256), (256, 512, 512)], rounds, workdir)
        thr_rows = bench_threads([1 << 20, 1 << 24], max(5, rounds // 2), workdir, probe)

    print(
        f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"(other processes compete for the same cores: numbers above ~0 load are noisy)\n"
    )
    print("## add_relu: relu(a + b), float32, GB/s at 12 bytes/element (time per call in us)\n")
    print(f"fused program ops: {add_rows[0][3]}; unfused program ops: {add_rows[0][4]}\n")
    print(
        "| elements | fused (ET) | unfused (ET) | eager | probe | fused/probe | fused/unfused "
        "| fused call | unfused call |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, t, g, _, _ in add_rows:
        print(
            f"| {fmt_n(n)} | {g['fused']:.1f} ({us(t['fused'])}) | {g['unfused']:.1f} ({us(t['unfused'])}) "
            f"| {g['eager']:.1f} ({us(t['eager'])}) | {g['probe']:.1f} ({us(t['probe'])}) "
            f"| {g['fused'] / g['probe']:.0%} | {g['fused'] / g['unfused']:.2f}x "
            f"| {g['fused call']:.1f} | {g['unfused call']:.1f} |"
        )
    print("\n## linear_relu: relu(x @ W.T + b), float32, GFLOP/s (time per call in us)\n")
    print(f"fused program ops: {lin_rows[0][3]}; unfused program ops: {lin_rows[0][4]}\n")
    print("| M x K x N | fused (ET) | unfused (ET) | eager | etfuse eager kernel | fused/unfused | fused/eager |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (m, k, n), t, g, _, _ in lin_rows:
        print(
            f"| {m}x{k}x{n} | {g['fused']:.1f} ({us(t['fused'])}) | {g['unfused']:.2f} ({us(t['unfused'])}) "
            f"| {g['eager']:.1f} ({us(t['eager'])}) | {g['etfuse eager']:.1f} ({us(t['etfuse eager'])}) "
            f"| {g['fused'] / g['unfused']:.0f}x | {g['fused'] / g['eager']:.0%} |"
        )
    print("\n## add_relu on the ExecuTorch threadpool at 1 and 2 threads, GB/s\n")
    print("| elements | fused 1T | fused 2T | unfused 1T | unfused 2T | probe 1T | probe 2T |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, res in thr_rows:
        print(
            f"| {fmt_n(n)} | {res[1]['fused']:.1f} | {res[2]['fused']:.1f} | {res[1]['unfused']:.1f} "
            f"| {res[2]['unfused']:.1f} | {res[1]['probe']:.1f} | {res[2]['probe']:.1f} |"
        )
    one_m = next(r for r in add_rows if r[0] == 1 << 20)
    print(
        f"\nTargets at 1M: fused >= 90% of probe: {one_m[2]['fused'] / one_m[2]['probe']:.0%}"
        f" ({'met' if one_m[2]['fused'] >= 0.9 * one_m[2]['probe'] else 'NOT met'}); "
        f"fused >= 2x unfused: {one_m[2]['fused'] / one_m[2]['unfused']:.2f}x"
        f" ({'met' if one_m[2]['fused'] >= 2 * one_m[2]['unfused'] else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
