"""Benchmark etfuse's fused GEMM / conv2d against the stock ExecuTorch runtime, torch eager and XNNPACK.

    python benchmarks/gemm_conv.py [--quick] [--rounds N] [--only linear,conv,conv1d,models]

Three tables, each measured side by side in one run (variants interleaved in batches, the
median batch reported; runtime variants and torch eager are separate groups, see
benchmarks/kernels.py):

* linear + relu (nn.Linear) at M x K x N = 64x256x256, 256x512x512, 1x1024x1024, in GFLOP/s
  (2*M*N*K / time): the etfuse-fused .pte (`etfuse::linear_relu.out`), the stock .pte
  (permute_copy + addmm + relu), torch eager.
* conv2d + relu, batch 1, 32x32 (ResNet-style 3x3 at 16/32/64 channels, a stride-2 3x3, a 1x1,
  depthwise 3x3 at 32/64 channels), GFLOP/s (2*Cout*Cin/groups*KH*KW*OH*OW / time): etfuse
  (`etfuse::conv2d_act.out`), the stock runtime's convolution + relu, torch eager.
* conv1d + relu, batch 1, the layer shapes of wav2letter (executorch's example speech model on a
  1x1x700 input), GFLOP/s: etfuse (the conv1d rules: `conv2d_act.out` on a height-1 image
  between unsqueeze/squeeze copies), the stock runtime's convolution + relu, torch eager.
* end to end, models from executorch.examples.models.mlperf_tiny (ResNet8 and DS-CNN: CNNs;
  DeepAutoEncoder: linear + batch norm + relu MLP): the stock portable .pte, the etfuse-fused
  .pte (FusionPass: every rule, batch norm included), the XNNPACK-delegated .pte
  (`to_edge_transform_and_lower(..., partitioner=[XnnpackPartitioner()])`), torch eager; ms per
  forward.

The GEMM and conv tables repeat etfuse (ExecuTorch threadpool reset to 1 thread) and torch
eager (`torch.set_num_threads(1)`) on one thread each. Runtime columns time `Method.execute()` on inputs set once.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import etfuse.backend_ops  # noqa: E402,F401
import etfuse.backend_ops.gemm_conv_ops  # noqa: E402,F401
import etfuse.kernels as kernels  # noqa: E402

_spec = importlib.util.spec_from_file_location("_etfuse_bench_kernels", Path(__file__).with_name("kernels.py"))
_kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kb)
interleaved, runtime_exec = _kb.interleaved, _kb.runtime_exec


def _load(buffer: bytes, workdir: Path, name: str):
    from executorch.runtime import Runtime

    path = workdir / f"{name}.pte"
    path.write_bytes(buffer)
    return Runtime.get().load_program(str(path)).load_method("forward")


def programs(model, args, workdir: Path, name: str, xnnpack: bool = False) -> dict:
    """{"etfuse": method, "stock": method[, "xnnpack": method]} and each program's op list."""
    from executorch.exir import to_edge, to_edge_transform_and_lower

    from etfuse.passes import FusionPass, fuse

    ep = torch.export.export(model, args)
    edge = to_edge(ep)
    out = {}
    fused = fuse(edge, [FusionPass()]).to_executorch()
    out["etfuse"] = fused
    out["stock"] = edge.to_executorch()
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        out["xnnpack"] = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    methods, ops = {}, {}
    for k, et in out.items():
        methods[k] = _load(et.buffer, workdir, f"{name}_{k}")
        ops[k] = [o.name + ("." + o.overload if o.overload else "") for o in et.executorch_program.execution_plan[0].operators]
    return methods, ops


def check(methods, model, args):
    with torch.no_grad():
        want = model(*args)
    for k, m in methods.items():
        got = m.execute(args)[0]
        err = float((got - want).abs().max())
        assert err < 1e-3 * max(1.0, float(want.abs().max())), f"{k}: max abs error {err}"


class LinearRelu(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.lin = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


class ConvRelu(torch.nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Conv1dRelu(torch.nn.Module):
    def __init__(self, cin, cout, k, stride=1):
        super().__init__()
        self.conv = torch.nn.Conv1d(cin, cout, k, stride=stride)

    def forward(self, x):
        return torch.relu(self.conv(x))


def _rows_for(model, args, workdir, name, flops, rounds, target_s):
    """GFLOP/s at the default thread counts, and etfuse / eager again on one thread each (on a
    shared 2-core machine a 2-thread OpenMP region collapses whenever another process holds a
    core; one thread each is the comparison that survives that)."""
    from executorch.extension.pybindings import portable_lib

    methods, ops = programs(model, args, workdir, name)
    check(methods, model, args)
    rt = interleaved({k: runtime_exec(m, args) for k, m in methods.items()}, rounds, target_s)
    with torch.no_grad():
        eager = interleaved({"eager": lambda: model(*args)}, rounds, target_s)["eager"]
    g = {k: flops / t / 1e9 for k, t in rt.items()}
    g["eager"] = flops / eager / 1e9
    threads, et_threads = torch.get_num_threads(), portable_lib._threadpool_get_thread_count()
    try:
        portable_lib._unsafe_reset_threadpool(1)
        torch.set_num_threads(1)
        g["etfuse_1t"] = flops / interleaved({"e": runtime_exec(methods["etfuse"], args)}, rounds, target_s)["e"] / 1e9
        with torch.no_grad():
            g["eager_1t"] = flops / interleaved({"e": lambda: model(*args)}, rounds, target_s)["e"] / 1e9
    finally:
        portable_lib._unsafe_reset_threadpool(et_threads)
        torch.set_num_threads(threads)
    return g, ops


def bench_linear(shapes, rounds, workdir):
    rows = []
    for m, k, n in shapes:
        model = LinearRelu(k, n).eval()
        x = torch.randn(m, k)
        g, ops = _rows_for(model, (x,), workdir, f"lin_{m}_{k}_{n}", 2 * m * n * k, rounds, 0.05)
        rows.append((f"{m}x{k}x{n}", g, ops))
    return rows


def bench_conv(shapes, rounds, workdir):
    rows = []
    for cin, cout, k, stride, groups, hw in shapes:
        model = ConvRelu(cin, cout, k, stride, groups).eval()
        x = torch.randn(1, cin, hw, hw)
        o = (hw + 2 * (k // 2) - k) // stride + 1
        flops = 2 * cout * (cin // groups) * k * k * o * o
        label = f"{cin}->{cout} {k}x{k} s{stride}{' dw' if groups > 1 else ''} {hw}x{hw}"
        g, ops = _rows_for(model, (x,), workdir, f"conv_{cin}_{cout}_{k}_{stride}_{groups}", flops, rounds, 0.05)
        rows.append((label, g, ops))
    return rows


def bench_conv1d(shapes, rounds, workdir):
    rows = []
    for cin, cout, k, stride, length in shapes:
        model = Conv1dRelu(cin, cout, k, stride).eval()
        x = torch.randn(1, cin, length)
        flops = 2 * cout * cin * k * ((length - k) // stride + 1)
        g, ops = _rows_for(model, (x,), workdir, f"conv1d_{cin}_{cout}_{k}_{stride}", flops, rounds, 0.05)
        rows.append((f"{cin}->{cout} k{k} s{stride} L{length}", g, ops))
    return rows


def bench_models(names, rounds, workdir):
    import executorch.examples.models.mlperf_tiny as tiny

    rows = []
    for name in names:
        wrapper = getattr(tiny, name)()
        model = wrapper.get_eager_model().eval()
        args = wrapper.get_example_inputs()
        methods, ops = programs(model, args, workdir, f"model_{name}", xnnpack=True)
        check(methods, model, args)
        rt = interleaved({k: runtime_exec(m, args) for k, m in methods.items()}, rounds, 0.1)
        with torch.no_grad():
            rt["eager"] = interleaved({"eager": lambda: model(*args)}, rounds, 0.1)["eager"]
        rows.append((name, rt, ops))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--only", default="linear,conv,conv1d,models", help="comma-separated tables to run")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    rounds = args.rounds or (3 if args.quick else 7)
    info = kernels.load()
    print(f"# etfuse GEMM / conv2d benchmark\n\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, kernels ISA {info.isa}, runtime threads {info.runtime_threads}, "
          f"torch threads {torch.get_num_threads()}; medians of {rounds} interleaved rounds\n")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        conv_shapes = [(16, 16, 3, 1, 1, 32), (32, 32, 3, 1, 1, 32), (64, 64, 3, 1, 1, 32), (32, 64, 3, 2, 1, 32),
                       (64, 64, 1, 1, 1, 32), (32, 32, 3, 1, 32, 32), (64, 64, 3, 1, 64, 32)]
        wav2letter = [(1, 250, 48, 2, 700), (250, 250, 7, 1, 327), (250, 2000, 32, 1, 291), (2000, 2000, 1, 1, 260)]
        tables = (
            ("linear", "linear + relu, GFLOP/s (targets: etfuse >= 50% of eager and >= 20x stock)", "M x K x N",
             lambda: bench_linear([(64, 256, 256), (256, 512, 512), (1, 1024, 1024)], rounds, workdir)),
            ("conv", "conv2d + relu, batch 1, GFLOP/s (targets: etfuse >= 30% of eager and >= 20x stock)", "conv",
             lambda: bench_conv(conv_shapes, rounds, workdir)),
            ("conv1d", "conv1d + relu, batch 1, wav2letter's layers, GFLOP/s", "conv1d",
             lambda: bench_conv1d(wav2letter, rounds, workdir)),
        )
        for key, title, first, rows in tables:
            if key not in only:
                continue
            print(f"## {title}\n")
            print(f"| {first} | etfuse | stock chain | eager | etfuse/eager | etfuse/stock | etfuse 1 thread | eager 1 thread | etfuse/eager 1 thread |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for label, g, _ in rows():
                print(f"| {label} | {g['etfuse']:.1f} | {g['stock']:.2f} | {g['eager']:.1f} | "
                      f"{100 * g['etfuse'] / g['eager']:.0f}% | {g['etfuse'] / g['stock']:.0f}x | "
                      f"{g['etfuse_1t']:.1f} | {g['eager_1t']:.1f} | {100 * g['etfuse_1t'] / g['eager_1t']:.0f}% |")
            print()
        if "models" not in only:
            return 0
        print("## end to end, ms per forward (target: etfuse within 3x of XNNPACK on a CNN)\n")
        print("| model | stock .pte | etfuse .pte | XNNPACK .pte | eager | etfuse / XNNPACK | stock / etfuse | operators in the etfuse .pte |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, t, ops in bench_models(["ResNet8Model", "DSCNNKWSModel", "DeepAutoEncoderModel"], rounds, workdir):
            ms = {k: 1e3 * v for k, v in t.items()}
            print(f"| {name.removesuffix('Model')} | {ms['stock']:.3f} | {ms['etfuse']:.3f} | {ms['xnnpack']:.3f} | "
                  f"{ms['eager']:.3f} | {ms['etfuse'] / ms['xnnpack']:.2f}x | {ms['stock'] / ms['etfuse']:.0f}x | "
                  f"{', '.join(sorted(set(ops['etfuse'])))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
