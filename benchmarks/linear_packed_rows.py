"""A few rows on a packed weight: `etfuse::linear_packed_act.out` (weight packed at fuse time into the
GEMM's [N16 / 16][K][16] panels) against `etfuse::linear_act.out` (the [N, K] weight as stored, its
few-row dot-product path), eager kernels, at 1, 2 and 4 rows (a decoding step's one token, and a
few), 1024x1024 and 2048x2048, no bias or activation.

    python benchmarks/linear_packed_rows.py [--rounds N] [--threads T]

The two ops are timed interleaved (a batch of calls of one, then of the other, round after round)
and the median batch per call is reported, which keeps the comparison fair on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import etfuse.kernels as kernels


def batch_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kernels.load(eager=True)
    ops = torch.ops.etfuse
    print(f"isa {kernels.current_isa()}, torch threads {torch.get_num_threads()}, {args.rounds} rounds, median us per call")
    print(f"{'rows':>4} {'K x N':>11} {'linear_act':>11} {'packed':>9} {'packed/unpacked':>16}")
    for n in (1024, 2048):
        torch.manual_seed(0)
        w = torch.randn(n, n)
        packed = ops.pack_gemm_weight(w)
        for m in (1, 2, 4):
            x = torch.randn(m, n)
            y_unpacked, y_packed = torch.empty(m, n), torch.empty(m, n)
            # the .out variants: their CPU kernels are etfuse's C++ ones (kernels.load(eager=True))
            unpacked_fn = lambda: ops.linear_act.out(x, w, out=y_unpacked)  # noqa: E731
            packed_fn = lambda: ops.linear_packed_act.out(x, packed, n, out=y_packed)  # noqa: E731
            torch.testing.assert_close(packed_fn(), unpacked_fn(), rtol=1e-4, atol=1e-3)
            calls = max(5, int(2e5 // (n * n // 1024)))
            for fn in (unpacked_fn, packed_fn):  # warm up
                batch_us(fn, calls)
            times = {"unpacked": [], "packed": []}
            for _ in range(args.rounds):
                times["unpacked"].append(batch_us(unpacked_fn, calls))
                times["packed"].append(batch_us(packed_fn, calls))
            u, p = statistics.median(times["unpacked"]), statistics.median(times["packed"])
            print(f"{m:>4} {f'{n}x{n}':>11} {u:>11.1f} {p:>9.1f} {p / u:>16.2f}")


if __name__ == "__main__":
    main()
