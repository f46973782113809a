"""The three routes' `.pte`s side by side: is the graph-module route as fast as `fuse`?

    python benchmarks/routes.py [--rounds 15]

`edge.transform(default_passes())` and `to_executorch(ExecutorchBackendConfig(passes=...))`
only see graph modules (no parameter values), so batch norm cannot be folded into the weights
there. etfuse fuses conv -> batch norm [-> act] into `conv2d_bn_act` instead, whose kernel applies
the batch norm as a per-channel scale and shift in its epilogue (computed per call, O(channels)),
in every route. The column "folded" is the ideal it is measured against: the model with batch
norm folded into the conv weights in eager (`torch.nn.utils.fusion.fuse_conv_bn_eval`), then
fused (plain `conv2d_act`). One run, interleaved, median ms per `Method.execute()`, next to the
stock portable program; also each program's max abs error against eager.

Quiet machine (load 1.0), `--rounds 7 --target-s 0.1`: ResNet-18-ish fuse / folded 1.01x,
to_executorch / fuse 1.00x; MobileNetV1-ish 0.99x and 1.01x (before conv2d_bn_act, the
graph-module route was 1.16-1.36x slower than fuse).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from executorch.exir import ExecutorchBackendConfig, to_edge  # noqa: E402

import sys  # noqa: E402

import etfuse  # noqa: E402
from etfuse.passes import default_passes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fusion_helpers import eval_with_bn_stats  # noqa: E402

_spec = importlib.util.spec_from_file_location("_etfuse_bench_kernels", Path(__file__).with_name("kernels.py"))
_kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kb)


def conv_bn(cin, cout, stride=1, groups=1):
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                               torch.nn.BatchNorm2d(cout), torch.nn.ReLU())


class ResNetish(torch.nn.Module):
    """ResNet-18-like stages (conv-bn-relu, 2 per stage), widths 64-512, then mean + linear."""

    def __init__(self):
        super().__init__()
        layers, cin = [conv_bn(3, 64, 2)], 64
        for cout in (64, 128, 256, 512):
            layers += [conv_bn(cin, cout, 2 if cout > 64 else 1), conv_bn(cout, cout)]
            cin = cout
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class MobileNetish(torch.nn.Module):
    """Depthwise-separable blocks with batch norm (MobileNetV1-like), 32-256 channels."""

    def __init__(self):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 2)], 32
        for cout, s in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1)):
            layers += [conv_bn(cin, cin, s, groups=cin),
                       torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU())]
            cin = cout
        self.body = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x).mean((2, 3))


def folded(model):
    """A copy with every conv -> BatchNorm2d pair folded in eager (the ideal: plain conv2d_act)."""
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, torch.nn.Sequential):
            for i in range(len(m) - 1):
                if isinstance(m[i], torch.nn.Conv2d) and isinstance(m[i + 1], torch.nn.BatchNorm2d):
                    m[i], m[i + 1] = fuse_conv_bn_eval(m[i], m[i + 1]), torch.nn.Identity()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--target-s", type=float, default=0.2, help="seconds per batch of calls")
    args = parser.parse_args()
    etfuse.kernels.load()
    from executorch.runtime import Runtime

    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)\n")
    print("| model (input) | stock portable (ms) | folded (ms) | fuse (ms) | transform (ms) | to_executorch(passes) (ms) "
          "| fuse / folded | transform / fuse | to_executorch / fuse | max abs error (fuse, transform, to_executorch) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    workdir = Path(tempfile.mkdtemp())
    for name, model, shape in (("ResNet-18-ish", ResNetish(), (1, 3, 96, 96)),
                               ("MobileNetV1-ish", MobileNetish(), (1, 3, 96, 96))):
        model = eval_with_bn_stats(model)
        x = torch.randn(shape)
        edge = to_edge(torch.export.export(model, (x,)))
        ptes = {
            "stock": to_edge(torch.export.export(model, (x,))).to_executorch(),
            "folded": etfuse.fuse(to_edge(torch.export.export(folded(model), (x,)))).to_executorch(),
            "fuse": etfuse.fuse(edge).to_executorch(),
            "transform": edge.transform(default_passes()).to_executorch(),
            "to_executorch": to_edge(torch.export.export(model, (x,))).to_executorch(
                ExecutorchBackendConfig(passes=default_passes())),
        }
        methods, errors = {}, {}
        with torch.no_grad():
            want = model(x)
        for k, pte in ptes.items():
            path = workdir / f"{name}_{k}.pte"
            path.write_bytes(pte.buffer)
            methods[k] = Runtime.get().load_program(str(path)).load_method("forward")
            errors[k] = float((methods[k].execute((x,))[0] - want).abs().max())
        t = _kb.interleaved({k: _kb.runtime_exec(m, (x,)) for k, m in methods.items()}, args.rounds, args.target_s)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"| {name} {tuple(shape)} | {ms['stock']:.2f} | {ms['folded']:.2f} | {ms['fuse']:.2f} | {ms['transform']:.2f} | "
              f"{ms['to_executorch']:.2f} | {ms['fuse'] / ms['folded']:.2f}x | {ms['transform'] / ms['fuse']:.2f}x | "
              f"{ms['to_executorch'] / ms['fuse']:.2f}x | "
              f"{errors['fuse']:.1e}, {errors['transform']:.1e}, {errors['to_executorch']:.1e} |", flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
