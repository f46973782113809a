"""Instructions per inference on ARM64, etfuse against XNNPACK, counted under qemu-aarch64.

    python benchmarks/arm.py [--cpu neoverse-n1] [--models cnn,dws,transformer,mlp]
                             [--build-dir DIR] [--hot MODEL]

There is no ARM64 machine here, so speed on ARM64 is measured as guest instructions executed
(../shared/tools/qemu-insn: deterministic, unaffected by the machine's load; not time). One
binary, etfuse_runner built for aarch64 from etfuse's CMake package against the aarch64
executorch wheel's SDK (etfuse::kernels, executorch::kernels_optimized, kernels_quantized and
the XNNPACK delegate), runs each model's programs with 1 thread:

* stock: the portable program on executorch::kernels_optimized;
* etfuse: `etfuse.fuse(to_edge(ep)).to_executorch()`;
* XNNPACK: `to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`.

Per forward = (count at 11 forwards - count at 1) / 10, which removes process start, program
load and one-time packing. `--hot MODEL` also prints the etfuse program's hottest functions
(qemu-insn's hot-block profile mapped through the runner's symbols).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpp  # noqa: E402  (benchmarks/cpp.py: build_runner)

import etfuse  # noqa: E402
import etfuse.kernels  # noqa: E402
from etfuse.kernels import sdk  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QEMU_INSN = ROOT.parent / "shared" / "tools" / "qemu-insn"
PROGRAMS = ("stock", "etfuse", "xnnpack")


# ---- the models (the four) -------------------------------------------------------------

def _conv_bn_relu(cin, cout, k=3, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


def cnn():
    """3x conv3x3+bn+relu, maxpool, global pool, linear; 64x64."""
    body = nn.Sequential(_conv_bn_relu(3, 32), _conv_bn_relu(32, 64, stride=2), nn.MaxPool2d(2),
                         _conv_bn_relu(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    return body, (1, 3, 64, 64)


def dws():
    """Depthwise-separable net, 96x96."""
    layers = [_conv_bn_relu(3, 16, stride=2)]
    for cin, cout, stride in ((16, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2)):
        layers += [_conv_bn_relu(cin, cin, groups=cin, stride=stride), _conv_bn_relu(cin, cout, k=1)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)), (1, 3, 96, 96)


class _Block(nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def transformer():
    """Transformer block, seq 32, dim 256."""
    return _Block(), (1, 32, 256)


def mlp():
    """MLP 512-2048-512, SiLU, batch 8."""
    return nn.Sequential(nn.Linear(512, 2048), nn.SiLU(), nn.Linear(2048, 512)), (8, 512)


MODELS = {"cnn": cnn, "dws": dws, "transformer": transformer, "mlp": mlp}


def programs(name: str, work: Path) -> tuple[dict, list]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower

    torch.manual_seed(0)
    model, shape = MODELS[name]()
    model.eval()
    for m in model.modules():  # batch norms with statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(shape)
    ep = torch.export.export(model, (x,))
    buffers = {"stock": to_edge(ep).to_executorch().buffer,
               "etfuse": etfuse.fuse(to_edge(ep)).to_executorch().buffer,
               "xnnpack": to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer}
    paths = {}
    for p, buf in buffers.items():
        paths[p] = work / f"{name}_{p}.pte"
        paths[p].write_bytes(buf)
    (work / f"{name}_input_0.bin").write_bytes(x.contiguous().numpy().tobytes())
    return paths, [work / f"{name}_input_0.bin"]


# ---- building and counting ---------------------------------------------------------------------

def build_tools(build_dir: Path, select: list[Path]) -> tuple[Path, Path]:
    """The qemu-insn plugins and the aarch64 runner (only the etfuse ops `select` call)."""
    for tool in ("qemu-aarch64", "aarch64-linux-gnu-g++", "cmake"):
        if shutil.which(tool) is None:
            sys.exit(f"arm.py needs {tool} (apt-get install -y g++-aarch64-linux-gnu qemu-user; pip install cmake)")
    plugins = build_dir / "qemu-insn"
    if not (plugins / "libinsncount.so").is_file():
        subprocess.run(["sh", str(QEMU_INSN / "build.sh"), str(plugins)], check=True, stdout=subprocess.DEVNULL)
    toolchain = Path(etfuse.kernels.cmake_prefix_path) / "aarch64-linux-gnu.toolchain.cmake"
    runner = cpp.build_runner(build_dir / "runner", sdk.fetch("aarch64") / "share" / "cmake",
                              (f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
                               f"-DETFUSE_SELECT_OPS_MODEL={';'.join(str(p) for p in select)}"))
    return plugins, runner


def count(plugins: Path, runner: Path, cpu: str, pte: Path, inputs: list[Path], forwards: int,
          plugin: str = "libinsncount.so", outfile: Path = None) -> int:
    outfile = outfile or pte.with_suffix(f".{forwards}.count")
    args = [a for i in inputs for a in ("--input", str(i))]
    cmd = ["qemu-aarch64", "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu",
           "-plugin", f"{plugins / plugin},outfile={outfile}",
           str(runner), str(pte), *args, "--iterations", str(forwards), "--warmup", "0", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return int(outfile.read_text().split()[0]) if plugin == "libinsncount.so" else 0


def per_forward(plugins, runner, cpu, pte, inputs) -> float:
    return (count(plugins, runner, cpu, pte, inputs, 11) - count(plugins, runner, cpu, pte, inputs, 1)) / 10


def hot_functions(plugins: Path, runner: Path, cpu: str, pte: Path, inputs: list[Path], top: int = 12) -> list:
    """(function, share of the instructions) for the hottest functions of the runner's own code."""
    out = pte.with_suffix(".hot")
    count(plugins, runner, cpu, pte, inputs, 11, plugin="libhotblocks.so", outfile=out)
    nm = subprocess.run(["aarch64-linux-gnu-nm", "-C", "--defined-only", "-n", str(runner)], capture_output=True,
                        text=True, check=True).stdout
    symbols = [(int(a, 16), name) for a, _, name in (line.split(" ", 2) for line in nm.splitlines()
                                                        if re.match(r"^[0-9a-f]+ [tTwW] ", line))]
    import bisect

    starts = [a for a, _ in symbols]
    base = 0x5500000000  # qemu-user's load address of a PIE guest (--no-pie runners: 0)
    totals, total = collections.Counter(), 0
    for line in out.read_text().splitlines():
        addr, executed, _ = line.split()
        addr, executed = int(addr, 16), int(executed)
        total += executed
        for a in (addr, addr - base):
            i = bisect.bisect_right(starts, a) - 1
            if i >= 0 and a - starts[i] < 1 << 20:
                totals[symbols[i][1][:110]] += executed
                break
        else:
            totals["(libraries)"] += executed
    return [(name, n / total) for name, n in totals.most_common(top)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", default="neoverse-n1")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "etfuse-bench-arm"))
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="which of them to count (stock is the slow one)")
    ap.add_argument("--hot", default="", help="also profile this model's etfuse program by function")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {list(MODELS)}")
    counted = set(args.programs.split(","))
    if counted - set(PROGRAMS):
        ap.error(f"unknown programs {sorted(counted - set(PROGRAMS))}; known: {list(PROGRAMS)}")
    build_dir = Path(args.build_dir)
    work = build_dir / "programs"
    work.mkdir(parents=True, exist_ok=True)
    made = {name: programs(name, work) for name in names}
    plugins, runner = build_tools(build_dir, [paths["etfuse"] for paths, _ in made.values()])
    print(f"\n-cpu {args.cpu}, 1 thread, instructions per forward (millions)\n")
    print("| model | stock | etfuse | XNNPACK | etfuse / XNNPACK |\n|---|---:|---:|---:|---:|")
    for name, (paths, inputs) in made.items():
        c = {p: per_forward(plugins, runner, args.cpu, paths[p], inputs) if p in counted else float("nan")
             for p in PROGRAMS}
        print(f"| {name} | {c['stock'] / 1e6:,.1f} | {c['etfuse'] / 1e6:,.2f} | {c['xnnpack'] / 1e6:,.2f} | "
              f"{c['etfuse'] / c['xnnpack']:.2f} |", flush=True)
    if args.hot:
        paths, inputs = made[args.hot]
        print(f"\n{args.hot}, etfuse: hottest functions (share of all instructions, 11 forwards)")
        for fn, share in hot_functions(plugins, runner, args.cpu, paths["etfuse"], inputs):
            print(f"  {share:6.1%}  {fn}")
    print(f"\nrunner: {runner}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
