"""Real CNN and audio models end to end: stock portable runtime, etfuse, XNNPACK, XNNPACK + etfuse.

    python benchmarks/models.py [--models resnet8,squeezenet,...] [--batch 1,8] [--rounds 5]
                                [--stock-batch 1] [--top 3] [--int8]

The zoo: the mlperf_tiny models that ship in executorch's wheel (ResNet8, DS-CNN KWS,
MobileNetV1-0.25), and our own definitions of the standard blocks where the original needs
torchvision (not installable beside this torch): a ResNet-18, SqueezeNet 1.1 (fire modules,
ceil-mode max pools), MobileNetV2 (inverted residuals, relu6), MobileNetV3-small style (hardswish,
squeeze-excite with hardsigmoid), EfficientNet-B0 style (MBConv with SiLU and squeeze-excite
with sigmoid), ShuffleNetV2 (channel shuffle, max pool) and a wav2letter-style conv1d stack.
Random init, eval mode, batch norms with non-trivial statistics.

For each model and batch size: the four programs lowered from one `torch.export`, each checked
against eager (relative max error), then timed on the ExecuTorch runtime interleaved in batches
(median; benchmarks/kernels.py), torch eager timed apart; the etfuse program's top ops by
ETDump time. The stock program is timed only at the batch sizes in --stock-batch (it runs for
seconds per forward on the larger models). Prints a Markdown table and the machine's load.

--int8: each model quantized first the way XNNPACK users do it (PT2E, the XNNPACK quantizer,
per-channel int8 weights, calibrated on the benchmark input; tests/fusion_helpers.pt2e_int8), and
compared with that quantized model in eager. No stock column: executorch's stock quantized kernels
cannot share a process with etfuse's (backend_ops/quantized_ops.py).
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
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import etfuse  # noqa: E402
import etfuse.kernels as kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fusion_helpers import eval_with_bn_stats, pt2e_int8  # noqa: E402

_spec = importlib.util.spec_from_file_location("_etfuse_bench_kernels", Path(__file__).with_name("kernels.py"))
_kb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kb)
interleaved, isolated, runtime_exec = _kb.interleaved, _kb.isolated, _kb.runtime_exec


# --- the standard blocks ----------------------------------------------------------------------


def conv_bn(cin, cout, k, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a, self.b = conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, act=None)
        self.skip = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.b(self.a(x)) + self.skip(x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 64, 7, 2)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks, self.fc = nn.Sequential(*blocks), nn.Linear(512, 1000)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        return self.fc(F.adaptive_avg_pool2d(self.blocks(x), 1).flatten(1))


class Fire(nn.Module):
    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.s = nn.Conv2d(cin, squeeze, 1)
        self.e1, self.e3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        s = F.relu(self.s(x))
        return torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3, 2)
        self.f = nn.ModuleList([Fire(64, 16, 64), Fire(128, 16, 64), Fire(128, 32, 128), Fire(256, 32, 128),
                                Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256)])
        self.head = nn.Conv2d(512, 1000, 1)

    def forward(self, x):
        pool = lambda y: F.max_pool2d(y, 3, 2, ceil_mode=True)  # noqa: E731
        x = pool(F.relu(self.conv(x)))
        x = pool(self.f[1](self.f[0](x)))
        x = pool(self.f[3](self.f[2](x)))
        for f in self.f[4:]:
            x = f(x)
        return F.adaptive_avg_pool2d(F.relu(self.head(x)), 1).flatten(1)


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze, gate):
        super().__init__()
        self.reduce, self.expand, self.gate = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1), gate

    def forward(self, x, act):
        s = act(self.reduce(x.mean((2, 3), keepdim=True)))
        return x * self.gate(self.expand(s))


class InvertedResidual(nn.Module):
    """MobileNetV2 (relu6), MobileNetV3 (hardswish, SE with hardsigmoid) and EfficientNet's MBConv
    (SiLU, SE with sigmoid) are this block with other activations."""

    def __init__(self, cin, cout, k, stride, expand, act, se_gate=None):
        super().__init__()
        mid = cin * expand
        self.expand = conv_bn(cin, mid, 1, act=act) if expand != 1 else nn.Identity()
        self.dw = conv_bn(mid, mid, k, stride, groups=mid, act=act)
        self.se = SqueezeExcite(mid, max(8, cin // 4), se_gate) if se_gate else None
        self.act = act()
        self.project = conv_bn(mid, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = self.se(y, self.act if not isinstance(self.act, nn.Hardswish) else F.relu)
        y = self.project(y)
        return x + y if self.residual else y


def mobile_net(stages, act, se_gate, stem=32, head=1280):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv_bn(3, stem, 3, 2, act=act)
            blocks, cin = [], stem
            for expand, cout, repeats, stride, k, se in stages:
                for i in range(repeats):
                    blocks.append(InvertedResidual(cin, cout, k, stride if i == 0 else 1, expand, act,
                                                   se_gate if se else None))
                    cin = cout
            self.blocks, self.head, self.fc = nn.Sequential(*blocks), conv_bn(cin, head, 1, act=act), nn.Linear(head, 1000)

        def forward(self, x):
            return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))

    return Net()


def mobilenet_v2():
    stages = [(1, 16, 1, 1, 3, 0), (6, 24, 2, 2, 3, 0), (6, 32, 3, 2, 3, 0), (6, 64, 4, 2, 3, 0), (6, 96, 3, 1, 3, 0),
              (6, 160, 3, 2, 3, 0), (6, 320, 1, 1, 3, 0)]
    return mobile_net(stages, nn.ReLU6, None)


def mobilenet_v3_small():
    stages = [(1, 16, 1, 2, 3, 1), (4, 24, 2, 2, 3, 0), (4, 40, 3, 2, 5, 1), (6, 48, 2, 1, 5, 1), (6, 96, 3, 2, 5, 1)]
    return mobile_net(stages, nn.Hardswish, nn.Hardsigmoid(), stem=16, head=576)


def efficientnet_b0():
    stages = [(1, 16, 1, 1, 3, 1), (6, 24, 2, 2, 3, 1), (6, 40, 2, 2, 5, 1), (6, 80, 3, 2, 3, 1), (6, 112, 3, 1, 5, 1),
              (6, 192, 4, 2, 5, 1), (6, 320, 1, 1, 3, 1)]
    return mobile_net(stages, nn.SiLU, nn.Sigmoid())


def channel_shuffle(y, groups=2):
    n, c, h, w = y.shape
    return y.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit: stride 1 splits the channels and transforms half; stride 2 (the first
    unit of a stage, cin -> cout channels) transforms all of them on two branches."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        inner = cin if stride == 2 else half
        self.branch = nn.Sequential(conv_bn(inner, half, 1), conv_bn(half, half, 3, stride, groups=half, act=None),
                                    conv_bn(half, half, 1))
        if stride == 2:
            self.short = nn.Sequential(conv_bn(cin, cin, 3, 2, groups=cin, act=None), conv_bn(cin, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, 1)
            return channel_shuffle(torch.cat([a, self.branch(b)], 1))
        return channel_shuffle(torch.cat([self.short(x), self.branch(x)], 1))


class ShuffleNetV2(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 24, 3, 2)
        units, cin = [], 24
        for cout, repeats in ((116, 4), (232, 8), (464, 4)):
            units += [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(repeats - 1)]
            cin = cout
        self.units, self.head, self.fc = nn.Sequential(*units), conv_bn(cin, 1024, 1), nn.Linear(1024, 1000)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        return self.fc(self.head(self.units(x)).mean((2, 3)))


class Wav2LetterStyle(nn.Module):
    """executorch's wav2letter example's layer shapes (conv1d + relu stack, 1x1 convs at the end)."""

    def __init__(self, classes=29):
        super().__init__()
        spec = [(1, 250, 48, 2, 23)] + [(250, 250, 7, 1, 3)] * 7 + [(250, 2000, 32, 1, 15), (2000, 2000, 1, 1, 0)]
        self.convs = nn.ModuleList(nn.Conv1d(i, o, k, s, p) for i, o, k, s, p in spec)
        self.out = nn.Conv1d(2000, classes, 1)

    def forward(self, x):
        for c in self.convs:
            x = F.relu(c(x))
        return self.out(x)


def _tiny(name):
    def make():
        import executorch.examples.models.mlperf_tiny as tiny

        wrapper = getattr(tiny, name)()
        return wrapper.get_eager_model(), tuple(wrapper.get_example_inputs())[0].shape

    return make


ZOO = {
    "resnet8": _tiny("ResNet8Model"),
    "ds_cnn": _tiny("DSCNNKWSModel"),
    "mobilenet_v1_025": _tiny("MobileNetV1025Model"),
    "resnet18": lambda: (ResNet18(), (1, 3, 96, 96)),
    "squeezenet1_1": lambda: (SqueezeNet11(), (1, 3, 96, 96)),
    "mobilenet_v2": lambda: (mobilenet_v2(), (1, 3, 96, 96)),
    "mobilenet_v3_small": lambda: (mobilenet_v3_small(), (1, 3, 96, 96)),
    "efficientnet_b0": lambda: (efficientnet_b0(), (1, 3, 96, 96)),
    "shufflenet_v2": lambda: (ShuffleNetV2(), (1, 3, 96, 96)),
    "wav2letter": lambda: (Wav2LetterStyle(), (1, 1, 700)),
}


# --- lowering and timing ----------------------------------------------------------------------


def lowered(model, args, workdir: Path, name: str, with_stock: bool, without: tuple = ()) -> dict:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from etfuse.passes import passes_beside_xnnpack

    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model, args)
    programs = {"etfuse": etfuse.fuse(to_edge(ep)).to_executorch().buffer,
                "xnnpack": to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer,
                # etfuse's rules for what XNNPACK leaves (attention, norms) before partitioning, the rest after
                "xnnpack+etfuse": etfuse.fuse(to_edge_transform_and_lower(
                    ep, transform_passes=passes_beside_xnnpack(), partitioner=[XnnpackPartitioner()])).to_executorch().buffer}
    if with_stock:
        programs["stock"] = to_edge(ep).to_executorch().buffer
    if without:  # what a family of rules buys: etfuse without the rules whose names contain these
        # ("prepack": without PrepackWeightsPass, the linears packing their weights per call)
        from etfuse.passes import FusionPass, PrepackWeightsPass, default_passes
        from etfuse.patterns import RULES

        kept = [r for r in RULES if not any(w in r.name for w in without)]
        passes = [FusionPass(kept) if type(p) is FusionPass else p for p in default_passes()
                  if not ("prepack" in without and type(p) is PrepackWeightsPass)]
        programs["etfuse without"] = etfuse.fuse(to_edge(ep), passes).to_executorch().buffer
    methods = {}
    for k, buf in programs.items():
        path = workdir / f"{name}_{k.replace('+', '_')}.pte"
        path.write_bytes(buf)
        methods[k] = Runtime.get().load_program(str(path)).load_method("forward")
    return programs, methods


def _has_etfuse_ops(pte: bytes) -> bool:
    """Whether the program calls any etfuse kernel (outside XNNPACK's delegate)."""
    from etfuse.profiling import _instruction_ops

    return any(op.startswith("etfuse::") for op in _instruction_ops(pte, "forward").values())


def pte_paths(programs: dict, workdir: Path, name: str) -> dict:
    """Where `lowered` wrote each program."""
    return {k: workdir / f"{name}_{k.replace('+', '_')}.pte" for k in programs}


def runtime_ms(methods: dict, programs: dict, inputs, rounds: int, workdir: Path, name: str, alone: bool) -> dict:
    """ms per forward of each program: interleaved in this process, or each in its own (`alone`)."""
    if alone:
        seconds = isolated(pte_paths(programs, workdir, name), inputs, rounds, 0.2, workdir)
    else:
        seconds = interleaved({k: runtime_exec(m, inputs) for k, m in methods.items()}, rounds, 0.2)
    return {k: 1e3 * v for k, v in seconds.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, from: {', '.join(ZOO)}")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--stock-batch", default="1", help="batch sizes at which the stock program is timed too")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=3, help="top ops of the etfuse program (ETDump) to print")
    ap.add_argument("--without", default="", help="comma-separated rule-name parts: also time etfuse without the "
                                                   "rules whose names contain one (e.g. pool,mean_hw,silu,sigmoid,gelu; "
                                                   "prepack: without PrepackWeightsPass)")
    ap.add_argument("--int8", action="store_true", help="quantize each model with PT2E (XNNPACK quantizer) first")
    ap.add_argument("--isolated", action="store_true",
                    help="time each .pte in its own process, the programs taking turns (slower to run; in one "
                         "process the loaded programs share the caches)")
    args = ap.parse_args(argv)
    info = kernels.load()
    print(f"# etfuse model benchmark\n\n{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start, "
          f"kernels ISA {info.isa}, runtime threads {info.runtime_threads}; ms per forward, medians of {args.rounds} "
          f"{'rounds, each program in its own process' if args.isolated else 'interleaved rounds'}; error: max "
          "|runtime - eager| / max |eager|\n")
    print("| model | input | stock | etfuse | XNNPACK | XNNPACK + etfuse | eager | etfuse / XNNPACK | "
          "XNNPACK+etfuse / XNNPACK | stock / etfuse | etfuse error | etfuse top ops (ETDump share) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    stock_batches = {int(b) for b in args.stock_batch.split(",") if b}
    without = tuple(w for w in args.without.split(",") if w)
    if without:
        print(f"etfuse without: the rules whose names contain {', '.join(without)} left out\n")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            torch.manual_seed(0)  # the same random weights every run: errors and times reproduce
            model, shape = ZOO[name]()
            model = eval_with_bn_stats(model)
            for batch in (int(b) for b in args.batch.split(",")):
                x = torch.randn((batch, *shape[1:]), generator=torch.Generator().manual_seed(batch))
                timed = pt2e_int8(model, (x,)) if args.int8 else model
                eager = timed.module() if args.int8 else model
                programs, methods = lowered(timed, (x,), Path(tmp), f"{name}_{batch}",
                                            batch in stock_batches and not args.int8, without)
                with torch.no_grad():
                    want = eager(x)
                errors = {}
                for k, m in methods.items():
                    got = m.execute((x,))[0]
                    errors[k] = float((got - want).abs().max() / want.abs().max())
                ms = runtime_ms(methods, programs, (x,), args.rounds, Path(tmp), f"{name}_{batch}", args.isolated)
                with torch.no_grad():
                    ms["eager"] = 1e3 * interleaved({"e": lambda: eager(x)}, args.rounds, 0.2)["e"]
                prof = etfuse.profile(programs["etfuse"], (x,), runs=2)
                top = ", ".join(f"{r.op.split('::')[-1]} {100 * r.share:.0f}%" for r in list(prof)[:args.top])
                stock = f"{ms['stock']:.2f}" if "stock" in ms else "-"
                ratio = f"{ms['stock'] / ms['etfuse']:.0f}x" if "stock" in ms else "-"
                if without:
                    top += (f"; etfuse without: {ms['etfuse without']:.2f} ms "
                            f"({ms['etfuse without'] / ms['etfuse']:.2f}x etfuse's time)")
                label = f"{name} int8" if args.int8 else name
                # etfuse fused nothing beside XNNPACK: the same program (or the same ops: the bytes
                # differ by metadata), so the ratio is timing noise
                same = "" if _has_etfuse_ops(programs["xnnpack+etfuse"]) else " (same program)"
                print(f"| {label} | {'x'.join(map(str, x.shape))} | {stock} | {ms['etfuse']:.2f} | {ms['xnnpack']:.2f} | "
                      f"{ms['xnnpack+etfuse']:.2f} | {ms['eager']:.2f} | {ms['etfuse'] / ms['xnnpack']:.2f}x | "
                      f"{ms['xnnpack+etfuse'] / ms['xnnpack']:.2f}x{same} | {ratio} | {errors['etfuse']:.1e} | {top} |",
                      flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
