"""Weight-only and dynamically quantized linear kernels against the float one, at llama's shapes.

    python benchmarks/weight_only.py [--rounds 7] [--threads 1,2] [--cold]

For each shape (rows M x in K x out N) and thread count: the eager etfuse kernels
`linear_act` (float32 weight), `linear_qw` int8 per channel and `linear_qw` int4 in groups of 32
and of 128, and `linear_dq` (8da4w: activations quantized per token) on the same int4 weight in
groups of 32, timed interleaved (benchmarks/kernels.py), median ms and the float kernel's time over
each quantized one's. M = 1 is a decoding step, M = 16 a prefill. Prints the machine's load.
With --cold each call reads the next of enough copies of its weight (64 MB of them) that the
weight is not in cache, as in a model whose weights outgrow the caches.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
from pathlib import Path

import torch

import etfuse.kernels as kernels

_spec = importlib.util.spec_from_file_location("_etfuse_bench_kernels", Path(__file__).with_name("kernels.py"))
_kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kb)

SHAPES = [(1, 1024, 2816), (1, 2816, 1024), (1, 1024, 4096), (16, 1024, 2816)]  # llama_large's linears


COLD_BYTES = 64 << 20


def variants(m: int, k: int, n: int, cold: bool = False) -> dict:
    g = torch.Generator().manual_seed(0)
    x, out = torch.randn(1, m, k, generator=g), torch.empty(0)
    qw = torch.ops.etfuse.linear_qw.out

    def weights(make, nbytes: int) -> itertools.cycle:
        return itertools.cycle([make() for _ in range(-(-COLD_BYTES // nbytes) if cold else 1)])

    def q4():
        q = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=g)
        return torch.ops.etfuse.pack_int4.out(q, out=torch.empty(0, dtype=torch.uint8))

    w = weights(lambda: torch.randn(n, k, generator=g), 4 * n * k)
    q8 = weights(lambda: (torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), torch.rand(n, 1)), n * k)
    q4_32 = weights(lambda: (q4(), torch.rand(n, k // 32)), n * k // 2 + n * k // 8)
    # linear_dq's weight sums: their values do not change the time
    sums32 = torch.zeros(n, k // 32, dtype=torch.int32)
    q4_128 = weights(lambda: (q4(), torch.rand(n, k // 128)), n * k // 2 + n * k // 32)
    return {
        "fp32": lambda: torch.ops.etfuse.linear_act.out(x, next(w), None, None, None, "none", out=out),
        "int8": lambda: qw(x, *next(q8), None, 8, None, "none", out=out),
        "int4 g32": lambda: qw(x, *next(q4_32), None, 4, None, "none", out=out),
        "int4 g128": lambda: qw(x, *next(q4_128), None, 4, None, "none", out=out),
        "8da4w g32": lambda: torch.ops.etfuse.linear_dq.out(x, *_with_sums(next(q4_32), sums32), None, 4, None, "none",
                                                             out=out),
    }


def _with_sums(weight_scales, sums):
    weight, scales = weight_scales
    return weight, sums, scales


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cold", action="store_true", help="weights not in cache (a new copy per call)")
    args = ap.parse_args(argv)
    info = kernels.load(eager=True)
    print(f"# weight-only and dynamically quantized linear kernels\n\n{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the "
          f"start, kernels ISA {info.isa}; eager kernels, weights {'not ' if args.cold else ''}in cache, ms per call, medians of {args.rounds} interleaved rounds\n")
    print("| M x K x N | threads | fp32 | int8 | int4 g32 | int4 g128 | 8da4w g32 | fp32 / int8 | fp32 / int4 g32 | "
          "fp32 / int4 g128 | fp32 / 8da4w g32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for m, k, n in SHAPES:
            ms = {name: 1e3 * t for name, t in _kb.interleaved(variants(m, k, n, args.cold), args.rounds, 0.1).items()}
            print(f"| {m} x {k} x {n} | {threads} | {ms['fp32']:.3f} | {ms['int8']:.3f} | {ms['int4 g32']:.3f} | "
                  f"{ms['int4 g128']:.3f} | {ms['8da4w g32']:.3f} | {ms['fp32'] / ms['int8']:.2f}x | "
                  f"{ms['fp32'] / ms['int4 g32']:.2f}x | {ms['fp32'] / ms['int4 g128']:.2f}x | "
                  f"{ms['fp32'] / ms['8da4w g32']:.2f}x |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
