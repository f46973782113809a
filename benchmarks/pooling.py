"""etfuse's pooling kernels against the stock ExecuTorch runtime and XNNPACK, per layer.

    python benchmarks/pooling.py [--rounds N]

Pooling layers of the CNNs in the model issue, batch 1, each as a one-op model: the stock .pte
(`max_pool2d_with_indices` / `avg_pool2d` / `mean.dim` portable kernels), the etfuse-fused
.pte (`etfuse::max_pool2d` / `avg_pool2d` / `mean_hw`), the XNNPACK-delegated .pte, and torch
eager; ms per forward, variants interleaved in batches, median batch (benchmarks/kernels.py),
runtime and eager timed in separate groups. Outputs checked against eager first.
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
import torch.nn.functional as F  # noqa: E402

import etfuse.kernels as kernels  # noqa: E402


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"_etfuse_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_gc = _sibling("gemm_conv")
programs, check, interleaved, runtime_exec = _gc.programs, _gc.check, _gc.interleaved, _gc.runtime_exec


class Pool(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# (label, input shape, function): the layers as the models have them
CASES = [
    ("ResNet-18 stem max 3x3 s2 p1", (1, 64, 112, 112), lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("SqueezeNet 1.1 max 3x3 s2 ceil", (1, 64, 111, 111), lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True)),
    ("SqueezeNet 1.1 max 3x3 s2 ceil (96x96 input)", (1, 128, 23, 23), lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True)),
    ("ShuffleNetV2 max 3x3 s2 p1", (1, 24, 112, 112), lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("max 2x2 s2", (1, 32, 64, 64), lambda x: F.max_pool2d(x, 2)),
    ("DS-CNN avg 25x5", (1, 64, 25, 5), lambda x: F.avg_pool2d(x, (25, 5))),
    ("avg 3x3 s1 p1 (Inception branch)", (1, 64, 28, 28), lambda x: F.avg_pool2d(x, 3, 1, 1)),
    ("MobileNetV2 global mean 1280x7x7", (1, 1280, 7, 7), lambda x: x.mean((2, 3))),
    ("ResNet-18 global avg 512x7x7 (adaptive)", (1, 512, 7, 7), lambda x: F.adaptive_avg_pool2d(x, 1)),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    info = kernels.load()
    load = os.getloadavg()[0]
    print(f"# etfuse pooling benchmark\n\n{os.cpu_count()} cores, load average {load:.1f}, kernels ISA {info.isa}, "
          f"runtime threads {info.runtime_threads}; ms per forward, medians of {args.rounds} interleaved rounds\n")
    print("| layer | input | stock | etfuse | XNNPACK | eager | stock / etfuse | etfuse / XNNPACK | etfuse op |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, shape, fn) in enumerate(CASES):
            model, x = Pool(fn).eval(), torch.randn(shape, generator=torch.Generator().manual_seed(i))
            methods, ops = programs(model, (x,), Path(tmp), f"pool{i}", xnnpack=True)
            check(methods, model, (x,))
            ms = {k: 1e3 * v for k, v in interleaved({k: runtime_exec(m, (x,)) for k, m in methods.items()},
                                                      args.rounds, 0.05).items()}
            with torch.no_grad():
                ms["eager"] = 1e3 * interleaved({"e": lambda: model(x)}, args.rounds, 0.05)["e"]
            print(f"| {label} | {'x'.join(map(str, shape))} | {ms['stock']:.3f} | {ms['etfuse']:.3f} | "
                  f"{ms['xnnpack']:.3f} | {ms['eager']:.3f} | {ms['stock'] / ms['etfuse']:.1f}x | "
                  f"{ms['etfuse'] / ms['xnnpack']:.2f}x | {', '.join(sorted(set(ops['etfuse'])))} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
