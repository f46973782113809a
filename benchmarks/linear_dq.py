"""8da4w linears at Llama-3.2-1B's shapes: etfuse's linear_dq against XNNPACK's and against fp32.

    python benchmarks/linear_dq.py [--rounds 7] [--shapes 2048x2048,2048x512,2048x8192,8192x2048]
                                   [--rows 1,64] [--group 32]

One `nn.Linear(K, N, bias=False)` per shape (in features K x out features N: q/o, k/v, the MLP's
gate/up and down), input [1, M, K] with M = 1 (a decode step) and M = 64 (a prefill), exported
three ways and run on executorch's runtime, each a `.pte`:

* fp32      etfuse.fuse of the float model (linear_act / linear_packed_act)
* 8da4w     etfuse.fuse after torchao's `Int8DynamicActivationIntxWeightConfig(weight_dtype=int4,
            weight_granularity=PerGroup(32))` (executorch's llama export's `-qmode 8da4w`):
            one `etfuse::linear_dq`
* xnnpack   the same quantized model lowered with `XnnpackPartitioner` (its qd8-f32-qb4w GEMM)

Timed interleaved (benchmarks/kernels.py, `Method.execute()` on inputs set once), the threadpool
at 1 thread, medians of the rounds; ratios from the same run. The decode bound: the 8da4w
weight's bytes (int4 nibbles, float32 scales, one float32 row sum a column) over the probe's bandwidth
(STREAM add, benchmarks/kernels.py); at these sizes the weights fit in a 32 MB L3, so the probe's
DRAM figure is a floor, not the cache's rate. Prints the machine's load at the start and the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import etfuse  # noqa: E402
import etfuse.kernels as kernels  # noqa: E402

_spec = importlib.util.spec_from_file_location("_etfuse_bench_kernels", Path(__file__).with_name("kernels.py"))
_kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kb)

SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048)]  # Llama-3.2-1B: (K, N)
VARIANTS = ("fp32", "8da4w", "xnnpack")


def programs(k: int, n: int, m: int, group: int) -> dict:
    """{variant: (.pte bytes, its non-delegated ops)} for one linear."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).eval()
    x = (torch.randn(1, m, k),)
    fp32 = etfuse.fuse(to_edge(torch.export.export(model, x))).to_executorch()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group)))
    ep = torch.export.export(model, x)
    out = {"fp32": fp32, "8da4w": etfuse.fuse(to_edge(ep)).to_executorch(),
           "xnnpack": to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()}
    return {v: (p.buffer, sorted({f"{o.name}.{o.overload}" for o in p.executorch_program.execution_plan[0].operators}))
            for v, p in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN, comma-separated")
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--group", type=int, default=32)
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(m) for m in args.rows.split(",")]

    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    info = kernels.load()
    torch.set_num_threads(1)
    portable_lib._unsafe_reset_threadpool(1)
    probe = _kb.load_probe()
    nb = 1 << 24
    bufs = [torch.rand(nb) for _ in range(3)]
    gbs = max(12 * nb / probe(*(b.data_ptr() for b in bufs), nb, 5) / 1e9 for _ in range(3))
    print(f"# 8da4w linears (group {args.group}) at Llama-3.2-1B's shapes\n\n{os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start, kernels ISA {info.isa}, 1 thread; executorch runtime, us per "
          f"call, medians of {args.rounds} interleaved rounds; probe bandwidth {gbs:.1f} GB/s (STREAM add)\n")
    print("| M | K x N | fp32 us | 8da4w us | XNNPACK us | XNNPACK / 8da4w | fp32 / 8da4w | 8da4w weight MB | "
          "8da4w GB/s | bound us |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for m in rows:
            for k, n in shapes:
                methods, ops = {}, {}
                for v, (buf, op) in programs(k, n, m, args.group).items():
                    path = Path(tmp) / f"{v}_{m}_{k}x{n}.pte"
                    path.write_bytes(buf)
                    methods[v] = Runtime.get().load_program(str(path)).load_method("forward")
                    ops[v] = op
                assert any("linear_dq" in o for o in ops["8da4w"]), ops["8da4w"]
                assert not [o for o in ops["xnnpack"] if "linear" in o or "mm" in o], ops["xnnpack"]
                x = torch.randn(1, m, k)
                calls = {v: _kb.runtime_exec(meth, (x,)) for v, meth in methods.items()}
                for call in calls.values():
                    call()
                us = {v: 1e6 * s for v, s in _kb.interleaved(calls, args.rounds, 0.2).items()}
                weight = n * k // 2 + 4 * n * (k // args.group) + 4 * n  # nibbles, float32 scales, row sums
                print(f"| {m} | {k} x {n} | {us['fp32']:.1f} | {us['8da4w']:.1f} | {us['xnnpack']:.1f} | "
                      f"{us['xnnpack'] / us['8da4w']:.2f}x | {us['fp32'] / us['8da4w']:.2f}x | {weight / 1e6:.2f} | "
                      f"{weight / us['8da4w'] / 1e3:.1f} | {weight / gbs / 1e3:.1f} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
