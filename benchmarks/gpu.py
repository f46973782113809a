"""Benchmark etfuse's Triton kernels on a CUDA GPU against torch's unfused ops and torch.compile.

    python benchmarks/gpu.py [--quick] [--sizes 1M,16M,256M] [--peak-gbs 3350] [--json out.json]

Needs a CUDA device and triton (`pip install "etfuse[triton]"`); exits with a message otherwise.
Every variant is first checked against torch (bit-exact for the quantized ops, float tolerance
otherwise), then timed with `triton.testing.do_bench` (CUDA events, L2 flushed between runs,
median of the repetitions).

Element-wise ops, in GB/s (bytes the op must move / time) and % of the HBM peak, at 1M, 16M
and 256M elements:

* add_relu float32 / float16       relu(a + b): 2 reads + 1 write per element
* quantized add_relu int8          q(relu(dq(a) + dq(b))): 1-byte elements, 2 reads + 1 write
* embedding_byte int8 -> float16   D = 256, one random row per index: weight row read +
                                   output row written (+ indices, scales)

columns: `triton` (the launcher), `eager` (the same launcher called from Python each time:
the Triton launch and the launcher's checks included), `op` (the registered `torch.ops`
functional op on CUDA tensors: dispatcher + Triton kernel), `torch` (torch's unfused ops: the
op's pattern), `compile` (torch.compile of the pattern, default mode), and `copy` (torch's
device-to-device copy of 4 bytes per element: a practical bandwidth ceiling). Every column but
`eager` is the GPU time of the call replayed from a CUDA graph, the L2 cache flushed before
each call (no Python launch overhead, operands read from HBM); `--no-graphs` times them like
`eager` (`do_bench`). A column that cannot be captured in a graph falls back to `do_bench` and
is marked `*`.

linear_relu float16 at 4096 x 4096 x 4096, in TFLOP/s (2*M*N*K / time): the Triton kernel, the
registered op, torch's `relu(linear(x, w, b))` (cuBLAS + a relu kernel) and torch.compile of it.

--peak-gbs sets the HBM peak the percentages use; by default it is looked up from the device
name (H100 SXM 3350, H100 PCIe/NVL 2000/3900, H200 4800, A100 80GB 2039), else the copy
bandwidth is used.
"""

from __future__ import annotations

import argparse
import json
import sys

KNOWN_PEAKS_GBS = [  # (substring of torch.cuda.get_device_name(), HBM peak in GB/s), first match wins
    ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
    ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0),
]


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s[:-1] if s[-1] in "KMG" else s) * mult


def ref_qadd(a, sa, za, la, ha, b, sb, zb, lb, hb, so, zo, lo, ho, relu=False):
    """The quantized add / add_relu pattern with torch.ao's decomposed ops (what etfuse's
    backend op binds, written here so that this script needs no executorch)."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines torch.ops.quantized_decomposed)

    qd = torch.ops.quantized_decomposed
    s = qd.dequantize_per_tensor(a, sa, za, la, ha, a.dtype) + qd.dequantize_per_tensor(b, sb, zb, lb, hb, b.dtype)
    return qd.quantize_per_tensor(torch.relu(s) if relu else s, so, zo, lo, ho, a.dtype)


def ref_embedding_byte(weight, scales, zero_points, qmin, qmax, indices):
    """The embedding_byte pattern (etfuse.backend_ops.quantized_ops._embedding_byte)."""
    import torch

    w = weight.to(torch.float32)
    if zero_points is not None:
        w = w - zero_points.reshape(-1, 1).to(torch.float32)
    w = w * scales.reshape(-1, 1).to(torch.float32)
    return torch.nn.functional.embedding(indices, w.to(scales.dtype))


def check_on_device(launch, dev, small: bool = False) -> int:
    """The kernels on `dev` against the references computed on the CPU, at shapes that mask
    and broadcast: bit-exact (quantized, embedding, float add_relu) or to tolerance (matmul)."""
    import torch

    g = torch.Generator().manual_seed(0)
    n = 0
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for sa, sb in (((1003 if small else 1000003,), (1003 if small else 1000003,)), ((37, 129), (129,)),
                       ((37, 1), (1, 129)), ((3, 1, 5, 7), (4, 1, 1))):
            a, b = torch.randn(sa, generator=g).to(dt), torch.randn(sb, generator=g).to(dt)
            got = launch.add_relu(a.to(dev), b.to(dev)).cpu()
            if small and dt == torch.bfloat16:  # the interpreter's bfloat16 rounding is not the GPU's
                torch.testing.assert_close(got, torch.relu(a + b))
            else:
                assert torch.equal(got, torch.relu(a + b)), ("add_relu", dt, sa, sb)
            n += 1
    for dt, (lo, hi) in ((torch.int8, (-128, 127)), (torch.uint8, (0, 255))):
        v = torch.arange(lo, hi + 1, dtype=torch.int32).to(dt)
        for qps in ((0.5, 0, 0.5, 0, 1.0, (lo + hi + 1) // 2), (0.013, lo + 3, 0.021, hi - 9, 0.029, lo + 50),
                    (1e-3, 0, 2e-3, 0, 1e-5, (lo + hi + 1) // 2)):
            sa, za, sb, zb, so, zo = qps
            for relu in (False, True):
                args = (v.reshape(-1, 1), sa, za, lo, hi, v.reshape(1, -1), sb, zb, lo, hi, so, zo, lo, hi)
                want = ref_qadd(*args, relu=relu)
                got = launch.quantized_add(*[t.to(dev) if isinstance(t, torch.Tensor) else t for t in args],
                                           relu=relu).cpu()
                assert torch.equal(got, want), ("quantized_add", dt, qps, relu, int((got != want).sum()))
                n += 1
        for sdt in (torch.float32, torch.float16):
            w = torch.randint(lo, hi + 1, (1000, 77), generator=g, dtype=torch.int32).to(dt)
            s = (torch.rand(1000, generator=g) * 0.1).to(sdt)
            z = torch.randint(lo, hi + 1, (1000,), generator=g)
            idx = torch.randint(0, 1000, (3, 333), generator=g)
            got = launch.embedding_byte(w.to(dev), s.to(dev), z.to(dev), lo, hi, idx.to(dev)).cpu()
            assert torch.equal(got, ref_embedding_byte(w, s, z, lo, hi, idx)), ("embedding_byte", dt, sdt)
            n += 1
    # (the interpreter's bfloat16 tl.dot is not usable: bfloat16 matmuls are checked on GPUs only)
    for dt, tol in ((torch.float16, 2e-2), (torch.bfloat16, 5e-2), (torch.float32, 1e-4)):
        if small and dt == torch.bfloat16:
            continue
        for M, N, K in ((33, 25, 19),) if small else ((333, 257, 129), (1024, 1024, 1024), (5, 3000, 64)):
            x = torch.randn(M, K, generator=g).to(dt)
            w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dt)
            bias = torch.randn(N, generator=g).to(dt)
            want = torch.relu(torch.nn.functional.linear(x.double(), w.double(), bias.double()))
            got = launch.linear_relu(x.to(dev), w.to(dev), bias.to(dev)).cpu().double()
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            m2 = (torch.randn(K, N, generator=g) / K ** 0.5).to(dt)
            want = torch.relu(bias.double() + x.double() @ m2.double())
            got = launch.addmm_relu(bias.to(dev), x.to(dev), m2.to(dev)).cpu().double()
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
            n += 2
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,16M,256M")
    ap.add_argument("--quick", action="store_true", help="1M and 16M only, no torch.compile")
    ap.add_argument("--peak-gbs", type=float, default=None)
    ap.add_argument("--mm", type=int, default=4096, help="M = N = K of the linear_relu benchmark")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--no-graphs", action="store_true",
                    help="time every column with do_bench (launch overhead included) instead of CUDA graph replay")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: run every variant once at tiny sizes through Triton's interpreter on CPU "
                         "tensors (checks the script, not the speed; needs TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)

    import os
    import time

    import torch

    smoke = args.smoke
    if smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
            return 2
        args.sizes, args.mm, args.quick = "4K", 64, True
    elif not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device; none is visible to torch. Not run.", file=sys.stderr)
        return 2
    import etfuse.kernels.triton as kt

    if not kt.available():
        print(kt.missing_reason(), file=sys.stderr)
        return 2
    import triton
    from triton.testing import do_bench
    from etfuse.kernels.triton import launch

    # The registered ops need etfuse's op catalog (and so executorch); without it the "op"
    # column is left out and everything else runs (the references are plain torch ops).
    try:
        import etfuse.backend_ops  # noqa: F401
        import etfuse.backend_ops.quantized_ops  # noqa: F401
        kt.register()
        have_ops = True
    except ImportError as e:
        print(f"note: etfuse's backend ops are not importable ({e}); the 'op' column is left out")
        have_ops = False

    dev = "cpu" if smoke else "cuda"

    n_checked = check_on_device(launch, dev, small=smoke)
    print(f"checked on {dev}: {n_checked} kernel calls against CPU references (masked and broadcast shapes, "
          "every dtype; quantized and float add_relu bit-exact)")

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes = [s for s in sizes if s <= 16 << 20]
    name = "cpu (Triton interpreter smoke run)" if smoke else torch.cuda.get_device_name()
    peak = args.peak_gbs or next((p for k, p in KNOWN_PEAKS_GBS if k in name), None)
    print(f"device: {name}; torch {torch.__version__}; triton {triton.__version__}")
    results = {"device": name, "peak_gbs": peak, "elementwise": [], "matmul": []}

    fallbacks: list = []

    def bench(fn) -> float:
        if smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        if args.no_graphs:
            return do_bench(fn, warmup=25, rep=100, return_mode="median")  # ms
        # GPU time of the call replayed from a CUDA graph: the kernels' time without the Python
        # launch overhead (which the `eager` column shows), L2 flushed before each call
        try:
            return bench_graph_cold(fn)
        except Exception as e:  # noqa: BLE001 - e.g. a call that syncs: time it eagerly
            fallbacks.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            torch.cuda.synchronize()
            return do_bench(fn, warmup=25, rep=100, return_mode="median")

    def compiled(fn):
        if args.quick:
            return None
        try:
            return torch.compile(fn)
        except Exception as e:  # noqa: BLE001
            print(f"  torch.compile unavailable: {e}", file=sys.stderr)
            return None

    qp = (0.05, 3, -128, 127)
    qb = (0.03, -2, -128, 127)
    qo = (0.07, -5, -128, 127)

    def q_pattern(a, b):
        return ref_qadd(a, *qp, b, *qb, *qo, relu=True)

    flush = None

    def bench_graph_cold(fn, calls: int = 10, replays: int = 7) -> float:
        """ms per call: one CUDA graph of `calls` x (L2 flush, fn) minus one of the flushes
        alone, median over replays. The flush (zeroing 256 MiB, more than L2) makes every call
        read its operands from HBM, as do_bench does between its calls."""
        nonlocal flush
        if flush is None:
            flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        fn()
        torch.cuda.synchronize()
        graphs = []
        for with_fn in (True, False):
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.cuda.graph(g):
                for _ in range(calls):
                    flush.zero_()
                    if with_fn:
                        fn()
            torch.cuda.current_stream().wait_stream(s)
            graphs.append(g)
        times = []
        for g in graphs:
            g.replay()
            torch.cuda.synchronize()
            ts = []
            for _ in range(replays):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                ts.append(start.elapsed_time(end))
            times.append(sorted(ts)[len(ts) // 2])
        del graphs
        return max(times[0] - times[1], 1e-6) / calls

    def bench_eager(fn) -> float:
        if smoke:
            return bench(fn)
        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    compiled_fns = {
        "add_relu": compiled(lambda a, b: torch.relu(a + b)),
        "qadd_relu": compiled(q_pattern),
        "embedding": compiled(ref_embedding_byte),
    }

    cases = []
    for n in sizes:
        for dt in (torch.float32, torch.float16):
            def make(n=n, dt=dt):
                a = torch.randn(n, device=dev, dtype=dt)
                b = torch.randn(n, device=dev, dtype=dt)
                return dict(
                    bytes=3 * n * a.element_size(), check="close",
                    triton=lambda: launch.add_relu(a, b), op=(lambda: torch.ops.etfuse.add_relu(a, b)) if have_ops else None,
                    torch=lambda: torch.relu(a + b),
                    compile=(lambda: compiled_fns["add_relu"](a, b)) if compiled_fns["add_relu"] else None)
            cases.append((f"add_relu {str(dt).replace('torch.', '')}", n, make))

        def make_q(n=n):
            a = torch.randint(-128, 128, (n,), device=dev, dtype=torch.int8)
            b = torch.randint(-128, 128, (n,), device=dev, dtype=torch.int8)
            return dict(
                bytes=3 * n, check="equal",
                triton=lambda: launch.quantized_add(a, *qp, b, *qb, *qo, relu=True),
                op=(lambda: torch.ops.quantized_decomposed.add_relu(a, *qp, b, *qb, *qo)) if have_ops else None,
                torch=lambda: q_pattern(a, b),
                compile=(lambda: compiled_fns["qadd_relu"](a, b)) if compiled_fns["qadd_relu"] else None)
        cases.append(("quantized add_relu int8", n, make_q))

        def make_e(n=n, D=256):
            rows = max(n // D, 1)
            w = torch.randint(-128, 128, (rows, D), device=dev, dtype=torch.int8)
            s = torch.rand(rows, device=dev, dtype=torch.float16) * 0.01
            zp = torch.randint(-10, 10, (rows,), device=dev, dtype=torch.int64)
            idx = torch.randperm(rows, device=dev)
            eargs = (w, s, zp, -128, 127, idx)
            return dict(
                bytes=rows * D * (1 + 2) + rows * (8 + 2 + 8), check="equal",
                triton=lambda: launch.embedding_byte(*eargs),
                op=(lambda: torch.ops.quantized_decomposed.embedding_byte(*eargs)) if have_ops else None,
                torch=lambda: ref_embedding_byte(*eargs),
                compile=(lambda: compiled_fns["embedding"](*eargs)) if compiled_fns["embedding"] else None)
        cases.append(("embedding_byte int8->float16", n, make_e))

    copy_gbs = {}
    for n in sizes:
        src = torch.empty(n * 4, device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy_gbs[n] = 2 * src.numel() / bench(lambda: dst.copy_(src)) / 1e6
        del src, dst
    peak = peak or max(copy_gbs.values())

    cols = ("triton", "eager", "op", "torch", "compile")  # on --smoke, "op" is the CPU path (pattern / C++)
    print(f"\nelement-wise, GB/s (% of {peak:.0f} GB/s HBM peak); copy = device copy of 2 x 4n bytes")
    print(f"{'kernel':30s} {'elements':>9s} " + " ".join(f"{c:>14s}" for c in cols) + f" {'copy':>8s}")
    for label, n, make in cases:
        v = make()
        ref = v["torch"]()
        row = {"kernel": label, "elements": n}
        cells = []
        v["eager"] = v["triton"]
        for c in cols:
            fn = v[c]
            if fn is None:
                cells.append(f"{'-':>14s}")
                continue
            got = fn()
            if v["check"] == "equal":
                assert torch.equal(got, ref), f"{label} {c}: not bit-exact with torch"
            else:
                torch.testing.assert_close(got, ref)
            before = len(fallbacks)
            ms = bench_eager(fn) if c == "eager" else bench(fn)
            gbs = v["bytes"] / ms / 1e6
            row[c] = gbs
            mark = "*" if len(fallbacks) > before else " "
            cells.append(f"{gbs:7.0f}{mark}({100 * gbs / peak:3.0f}%)")
        print(f"{label:30s} {n:>9d} " + " ".join(cells) + f" {copy_gbs[n]:8.0f}")
        results["elementwise"].append(row)
        del v, ref
        torch.cuda.empty_cache()

    M = N = K = args.mm
    x = torch.randn(M, K, device=dev, dtype=torch.float16)
    w = torch.randn(N, K, device=dev, dtype=torch.float16) / K ** 0.5
    bias = torch.randn(N, device=dev, dtype=torch.float16)
    flop = 2 * M * N * K
    lin = lambda: torch.relu(torch.nn.functional.linear(x, w, bias))  # noqa: E731
    clin = compiled(lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b)))
    variants = {"triton": lambda: launch.linear_relu(x, w, bias),
                "op": (lambda: torch.ops.etfuse.linear_relu(x, w, bias)) if have_ops else None, "torch": lin,
                "compile": (lambda: clin(x, w, bias)) if clin else None}
    ref = lin()
    print(f"\nlinear_relu float16 {M}x{K} @ {K}x{N}^T + bias, TFLOP/s")
    row = {"kernel": "linear_relu float16", "M": M, "N": N, "K": K}
    for c, fn in variants.items():
        if fn is None:
            continue
        torch.testing.assert_close(fn(), ref, rtol=2e-2, atol=2e-2)
        before = len(fallbacks)
        tflops = flop / bench(fn) / 1e9
        row[c] = tflops
        print(f"  {c:8s} {tflops:7.1f}{'*' if len(fallbacks) > before else ''}")
    if fallbacks:
        print("* timed without a CUDA graph: " + "; ".join(sorted(set(fallbacks))))
        results["graph_fallbacks"] = sorted(set(fallbacks))
    results["matmul"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
