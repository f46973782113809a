"""Instructions per inference on ARM64, etfuse against XNNPACK, counted under qemu-aarch64.

    python benchmarks/arm.py [--cpus neoverse-n1[,max]] [--models cnn,dws,... | issue | zoo | transformers | int8 | all]
                             [--programs stock,etfuse,xnnpack] [--build-dir DIR] [--hot MODEL]

There is no ARM64 machine here, so speed on ARM64 is measured as guest instructions executed
(deterministic, unaffected by the machine's load; not time). One binary, etfuse_runner built for
aarch64 from etfuse's CMake package against the aarch64 executorch wheel's SDK (etfuse::kernels,
executorch::kernels_optimized, kernels_quantized and the XNNPACK delegate), runs each model's
programs with 1 thread:

* stock: the portable program on executorch::kernels_optimized;
* etfuse: `etfuse.fuse(to_edge(ep)).to_executorch()`;
* XNNPACK: `to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`.

Models (--models takes names or groups): `issue`, the four of issue 43 (cnn, dws, transformer,
mlp); `zoo`, benchmarks/models.py's CNN zoo; `transformers`, benchmarks/transformers.py's ViT-B/16
at 96x96, the example llama's prefill and decode step, and MobileBERT (needs `transformers`);
`int8`, MobileNetV2 quantized by PT2E with the XNNPACK quantizer, and the example llama's decode
step with torchao int4 weight-only linears (etfuse only: neither the portable runtime nor
XNNPACK runs torchao's dequantize_affine), and the same step in 8da4w (torchao's int8 dynamic
activations x int4 weights, as benchmarks/llm.py quantizes: etfuse's linear_dq and XNNPACK's
dynamically quantized linears).

Per forward = (count at 1 + R forwards - count at 1) / R, which removes process start, program
load and one-time packing (R = 10, or 2 for the zoo and the transformers: the counts are
deterministic, so R only divides). Counted by benchmarks/qemu/macs.c, a qemu plugin that also
counts the multiply-add instructions (fmla, sdot, ...): the "MACs" columns show arithmetic apart
from overhead. Use `-cpu neoverse-n1` (ARMv8.2 with dot product, like a Cortex-A76); on qemu's
`max` XNNPACK takes SME kernels most ARM64 devices lack (--cpus neoverse-n1,max adds its columns).
`--hot MODEL` also prints the etfuse program's hottest functions (../shared/tools/qemu-insn's
hot-block profile mapped through the runner's symbols).
"""

from __future__ import annotations

import argparse
import collections
import math
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpp  # noqa: E402  (benchmarks/cpp.py: build_runner)
import models as zoo  # noqa: E402  (benchmarks/models.py: the CNN zoo; puts tests/ on sys.path)

import etfuse  # noqa: E402
import etfuse.kernels  # noqa: E402
from etfuse.kernels import sdk  # noqa: E402
from deploy_models import TransformerBlock  # noqa: E402  (tests/: the block the deployment tests run)
from fusion_helpers import benchmark_module, pt2e_int8  # noqa: E402

tzoo = benchmark_module("transformers")  # not `import transformers`: that name is Hugging Face's

ROOT = Path(__file__).resolve().parent.parent
QEMU_INSN = ROOT.parent / "shared" / "tools" / "qemu-insn"
PROGRAMS = ("stock", "etfuse", "xnnpack")


# ---- the models ------------------------------------------------------------------------------

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


def transformer():
    """Transformer block, seq 32, dim 256 (layer norms, causal SDPA, GELU MLP)."""
    return TransformerBlock(dim=256, heads=4), (1, 32, 256)


def mlp():
    """MLP 512-2048-512, SiLU, batch 8."""
    return nn.Sequential(nn.Linear(512, 2048), nn.SiLU(), nn.Linear(2048, 512)), (8, 512)


def llama_decode_int4():
    """The example llama's decode step, its linears' weights int4 in groups of 32 (torchao)."""
    model, example = tzoo.ZOO["llama_decode"]()
    return tzoo.weight_only(model, 4), example


def llama_decode_8da4w():
    """The example llama's decode step, 8da4w as benchmarks/llm.py applies it: torchao's
    Int8DynamicActivationIntxWeightConfig (per-token int8 activations, int4 weights in groups of 32)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    model, example = tzoo.ZOO["llama_decode"]()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    return model, example


@dataclass(frozen=True)
class Model:
    make: Callable  # () -> (module, input shape or example args)
    quant: str = ""  # "int8": PT2E with the XNNPACK quantizer first; "int4": etfuse only; "8da4w": torchao's ops
    repeats: int = 10


MODELS = {
    "cnn": Model(cnn), "dws": Model(dws), "transformer": Model(transformer), "mlp": Model(mlp),
    **{name: Model(make, repeats=2) for name, make in zoo.ZOO.items()},
    **{name: Model(tzoo.ZOO[name], repeats=2) for name in ("vit_b16_96", "llama_prefill", "llama_decode",
                                                           "mobilebert")},
    "mobilenet_v2_int8": Model(zoo.ZOO["mobilenet_v2"], quant="int8", repeats=2),
    "llama_decode_int4": Model(llama_decode_int4, quant="int4", repeats=2),
    "llama_decode_8da4w": Model(llama_decode_8da4w, quant="8da4w", repeats=2),
}
GROUPS = {
    "issue": ["cnn", "dws", "transformer", "mlp"],
    "zoo": list(zoo.ZOO),
    "transformers": ["vit_b16_96", "llama_prefill", "llama_decode", "mobilebert"],
    "int8": ["mobilenet_v2_int8", "llama_decode_int4", "llama_decode_8da4w"],
}
GROUPS["all"] = [m for g in ("issue", "zoo", "transformers", "int8") for m in GROUPS[g]]


def example_args(made) -> tuple:
    """export's example arguments: the zoo gives an input shape, the transformers their args."""
    model, spec = made
    if all(isinstance(d, int) for d in spec):
        return (torch.randn(spec),)
    return tuple(spec)


def programs(name: str, work: Path, wanted=PROGRAMS) -> tuple[dict, list]:
    """Each wanted program's .pte (of those this model has) and the runner's input files; etfuse's
    always (the runner's selective build reads it)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower

    spec = MODELS[name]
    torch.manual_seed(0)
    made = spec.make()
    model = zoo.eval_with_bn_stats(made[0]) if isinstance(made[0], nn.Module) else made[0]
    model.eval()
    args = example_args((model, made[1]))  # the llama's decode step: (tokens, {"input_pos": ...})
    ep = pt2e_int8(model, args) if spec.quant == "int8" else torch.export.export(model, args)
    etfuse.kernels.load()  # its quantized_decomposed out variants: the int8 stock program lowers to them
    lower = {"stock": lambda: to_edge(ep).to_executorch(),
             "etfuse": lambda: etfuse.fuse(to_edge(ep)).to_executorch(),
             "xnnpack": lambda: to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()}
    if spec.quant == "int4":
        lower = {"etfuse": lambda: etfuse.fuse(to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)))
                 .to_executorch()}
    if spec.quant == "8da4w":  # torchao's ops are not core ATen: edge's validity check off, as llm.py's export
        config = EdgeCompileConfig(_check_ir_validity=False)
        lower = {"etfuse": lambda: etfuse.fuse(to_edge(ep, compile_config=config)).to_executorch(),
                 "xnnpack": lambda: to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                                                compile_config=config).to_executorch()}
    buffers = {p: lower[p]().buffer for p in lower if p in wanted or p == "etfuse"}
    paths = {}
    for p, buf in buffers.items():
        paths[p] = work / f"{name}_{p}.pte"
        paths[p].write_bytes(buf)
    inputs = []
    for i, t in enumerate(tzoo.flat(args)):
        inputs.append(work / f"{name}_input_{i}.bin")
        inputs[-1].write_bytes(t.contiguous().numpy().tobytes())
    return paths, inputs


# ---- building and counting ---------------------------------------------------------------------

def build_tools(build_dir: Path, select: list[Path]) -> tuple[Path, Path]:
    """The qemu-insn plugins and the aarch64 runner (only the etfuse ops `select` call)."""
    for tool in ("qemu-aarch64", "aarch64-linux-gnu-g++", "cmake"):
        if shutil.which(tool) is None:
            sys.exit(f"arm.py needs {tool} (apt-get install -y g++-aarch64-linux-gnu qemu-user; pip install cmake)")
    plugins = build_dir / "qemu-insn"
    if not (plugins / "libhotblocks.so").is_file():
        subprocess.run(["sh", str(QEMU_INSN / "build.sh"), str(plugins)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", str(plugins / "libmacs.so"),
                    str(Path(__file__).resolve().parent / "qemu" / "macs.c")], check=True)
    toolchain = Path(etfuse.kernels.cmake_prefix_path) / "aarch64-linux-gnu.toolchain.cmake"
    runner = cpp.build_runner(build_dir / "runner", sdk.fetch("aarch64") / "share" / "cmake",
                              (f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
                               f"-DETFUSE_SELECT_OPS_MODEL={';'.join(str(p) for p in select)}"))
    return plugins, runner


def count(plugins: Path, runner: Path, cpu: str, pte: Path, inputs: list[Path], forwards: int,
          plugin: str = "libmacs.so", outfile: Path = None, strace: bool = False) -> tuple[int, int]:
    """(instructions, multiply-add instructions) of one runner process doing `forwards` forwards
    (another plugin: its file only; `strace`: qemu's syscall trace, where the libraries land, in
    outfile + ".strace")."""
    outfile = outfile or pte.with_suffix(f".{cpu}.{forwards}.count")
    args = [a for i in inputs for a in ("--input", str(i))]
    cmd = ["qemu-aarch64", "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu", *(["-strace"] if strace else []),
           "-plugin", f"{plugins / plugin},outfile={outfile}",
           str(runner), str(pte), *args, "--iterations", str(forwards), "--warmup", "0", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    if strace:
        Path(f"{outfile}.strace").write_text(proc.stderr)
    if plugin != "libmacs.so":
        return 0, 0
    insns, macs = outfile.read_text().split()
    return int(insns), int(macs)


def per_forward(plugins, runner, cpu, pte, inputs, repeats: int) -> tuple[float, float]:
    """(instructions, multiply-adds) per forward: (count at 1 + repeats forwards - count at 1) / repeats."""
    one, more = (count(plugins, runner, cpu, pte, inputs, n) for n in (1, 1 + repeats))
    return (more[0] - one[0]) / repeats, (more[1] - one[1]) / repeats


def _code_maps(strace: str) -> list[tuple[int, int, str]]:
    """(start, end, library) of each executable mapping in a qemu -strace log."""
    files, maps = {}, []
    for line in strace.splitlines():
        m = re.search(r'openat\(AT_FDCWD,"([^"]+)",.*\) = (\d+)$', line)
        if m:
            files[m.group(2)] = Path(m.group(1)).name
        m = re.search(r"mmap\((0x[0-9a-f]+),(\d+),PROT_EXEC[^,]*,[^,]*,(\d+),(0x[0-9a-f]+|\d+)\) = (0x[0-9a-f]+)", line)
        if m and m.group(3) in files:
            start = int(m.group(5), 16)
            maps.append((start, start + int(m.group(2)), files[m.group(3)]))
    return maps


def hot_functions(plugins: Path, runner: Path, cpu: str, pte: Path, inputs: list[Path], top: int = 12) -> list:
    """(function, share of the instructions) for the hottest functions of the runner's own code;
    the shared libraries' instructions summed per library."""
    import bisect

    out = pte.with_suffix(".hot")
    count(plugins, runner, cpu, pte, inputs, 11, plugin="libhotblocks.so", outfile=out, strace=True)
    libraries = _code_maps(Path(f"{out}.strace").read_text())
    nm = subprocess.run(["aarch64-linux-gnu-nm", "-C", "--defined-only", "-n", str(runner)], capture_output=True,
                        text=True, check=True).stdout
    symbols = [(int(a, 16), name) for a, _, name in (line.split(" ", 2) for line in nm.splitlines()
                                                        if re.match(r"^[0-9a-f]+ [tTwW] ", line))]
    starts = [a for a, _ in symbols]
    base = 0x5500000000  # qemu-user's load address of a PIE guest (--no-pie runners: 0)
    totals, total = collections.Counter(), 0
    for line in out.read_text().splitlines():
        addr, executed, _ = line.split()
        addr, executed = int(addr, 16), int(executed)
        total += executed
        library = next((name for lo, hi, name in libraries if lo <= addr < hi), None)
        if library:
            totals[f"({library})"] += executed
            continue
        for a in (addr, addr - base):
            i = bisect.bisect_right(starts, a) - 1
            if i >= 0 and a - starts[i] < 1 << 20:
                totals[symbols[i][1][:110]] += executed
                break
        else:
            totals["(elsewhere: the loader, qemu's vdso)"] += executed
    return [(name, n / total) for name, n in totals.most_common(top)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", default="neoverse-n1", help="qemu -cpu models, one column set each")
    ap.add_argument("--models", default="issue", help=f"names or groups {sorted(GROUPS)}")
    ap.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "etfuse-bench-arm"))
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="which of them to count (stock is the slow one)")
    ap.add_argument("--hot", default="", help="also profile this model's etfuse program by function")
    args = ap.parse_args(argv)
    names = [n for m in args.models.split(",") if m for n in GROUPS.get(m, [m])]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {list(MODELS)} and groups {sorted(GROUPS)}")
    if "mobilebert" in names and not _has_transformers():
        print("mobilebert skipped: the `transformers` package is not installed (pip install \".[bench]\")", file=sys.stderr)
        names.remove("mobilebert")
    counted = set(args.programs.split(","))
    if counted - set(PROGRAMS):
        ap.error(f"unknown programs {sorted(counted - set(PROGRAMS))}; known: {list(PROGRAMS)}")
    cpus = [c for c in args.cpus.split(",") if c]
    build_dir = Path(args.build_dir)
    work = build_dir / "programs"
    work.mkdir(parents=True, exist_ok=True)
    made = {name: programs(name, work, counted) for name in names}
    plugins, runner = build_tools(build_dir, [paths["etfuse"] for paths, _ in made.values()])
    for cpu in cpus:
        print(f"\n-cpu {cpu}, 1 thread, per forward: instructions (millions), multiply-add instructions "
              "(MACs, millions), etfuse / XNNPACK and etfuse / stock instruction ratios\n")
        print("| model | stock | etfuse | XNNPACK | etfuse MACs | XNNPACK MACs | etfuse / XNNPACK | etfuse / stock |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, (paths, inputs) in made.items():
            nan = (math.nan, math.nan)
            c = {p: per_forward(plugins, runner, cpu, paths[p], inputs, MODELS[name].repeats)
                 if p in counted and p in paths else nan for p in PROGRAMS}
            print(f"| {name} | {c['stock'][0] / 1e6:,.1f} | {c['etfuse'][0] / 1e6:,.2f} | {c['xnnpack'][0] / 1e6:,.2f} | "
                  f"{c['etfuse'][1] / 1e6:,.2f} | {c['xnnpack'][1] / 1e6:,.2f} | {c['etfuse'][0] / c['xnnpack'][0]:.2f} | "
                  f"{c['etfuse'][0] / c['stock'][0]:.3f} |", flush=True)
    if args.hot:
        paths, inputs = made[args.hot]
        print(f"\n{args.hot}, etfuse: hottest functions (share of all instructions, 11 forwards)")
        for fn, share in hot_functions(plugins, runner, cpus[0], paths["etfuse"], inputs):
            print(f"  {share:6.1%}  {fn}")
    print(f"\nrunner: {runner}")
    return 0


def _has_transformers() -> bool:
    return tzoo.import_transformers() is not None


if __name__ == "__main__":
    raise SystemExit(main())
