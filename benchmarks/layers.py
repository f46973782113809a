"""One layer at a time on the ExecuTorch runtime: etfuse against the XNNPACK delegate, per shape.

    python benchmarks/layers.py [--convs CIN-COUT-HW-K-STRIDE-GROUPS,...] [--linears MxKxN,...] [--rounds 7]

Where a model benchmark (models.py, transformers.py) says a model is slower than XNNPACK, this
says which layer shapes are: each conv is `Conv2d(bias=False) -> BatchNorm2d -> ReLU6` on a batch-1
HW x HW input (padding K // 2), each linear `nn.Linear(K, N)` on a [1, M, K] input. Both programs
are lowered as models.py lowers them (`etfuse.fuse(to_edge(...))` with every default pass, weights
packed at fuse time included; `to_edge_transform_and_lower(..., XnnpackPartitioner())`), timed
interleaved (`Method.execute()`, medians), and printed with GFLOP/s and the etfuse / XNNPACK ratio.
The default shapes are MobileNetV2's at 96x96 (stem, depthwise, pointwise, small maps) and the
linears of ViT-B/16 at 96x96, MobileBERT and the example llamas.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402  (its lowering, timing and kernel loading)

import torch  # noqa: E402

CONVS = ("3-32-96-3-2-1,32-32-48-3-1-32,32-16-48-1-1-1,16-96-48-1-1-1,96-96-48-3-2-96,96-24-24-1-1-1,"
         "24-144-24-1-1-1,144-144-24-3-1-144,144-144-24-3-2-144,144-32-12-1-1-1,32-192-12-1-1-1,192-192-12-3-1-192,"
         "192-192-12-3-2-192,64-384-6-1-1-1,384-384-6-3-1-384,384-64-6-1-1-1,576-576-6-3-2-576,960-960-3-3-1-960,"
         "160-960-3-1-1-1,64-64-25-3-1-64")
LINEARS = "37x768x768,37x768x3072,37x3072x768,8x128x512,8x512x128,8x128x128,16x288x768,16x1024x1024"


def conv_layer(spec: str):
    cin, cout, hw, k, stride, groups = map(int, spec.split("-"))
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                                torch.nn.BatchNorm2d(cout), torch.nn.ReLU6()).eval()
    out = (hw + 2 * (k // 2) - k) // stride + 1
    flops = 2 * cout * cin // groups * k * k * out * out
    return f"conv {cin}->{cout} {k}x{k}/{stride} g{groups} on {hw}x{hw}", model, torch.randn(1, cin, hw, hw), flops


def linear_layer(spec: str):
    m, k, n = map(int, spec.split("x"))
    return f"linear {m}x{k}x{n}", torch.nn.Linear(k, n).eval(), torch.randn(1, m, k), 2 * m * k * n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--convs", default=CONVS, help="CIN-COUT-HW-K-STRIDE-GROUPS, comma-separated ('' for none)")
    ap.add_argument("--linears", default=LINEARS, help="MxKxN, comma-separated ('' for none)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    models.kernels.load()
    layers = [conv_layer(s) for s in args.convs.split(",") if s] + [linear_layer(s) for s in args.linears.split(",") if s]
    print(f"# etfuse vs XNNPACK, one layer at a time\n\n{os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start; us per call, medians of {args.rounds} interleaved rounds\n")
    print("| layer | etfuse us | GFLOP/s | XNNPACK us | GFLOP/s | etfuse / XNNPACK |\n|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, model, x, flops) in enumerate(layers):
            torch.manual_seed(0)
            _, methods = models.lowered(model, (x,), Path(tmp), f"layer{i}", False)
            variants = {k: models._kb.runtime_exec(methods[k], (x,)) for k in ("etfuse", "xnnpack")}
            t = models._kb.interleaved(variants, args.rounds, 0.05)
            e, xn = t["etfuse"], t["xnnpack"]
            print(f"| {name} | {e * 1e6:.1f} | {flops / e / 1e9:.1f} | {xn * 1e6:.1f} | {flops / xn / 1e9:.1f} | "
                  f"{e / xn:.2f}x |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
