"""Benchmark etfuse's quantized fusions.

    python benchmarks/quantized.py [--quick] [--skip-pass] [--skip-runtime]

1. Runtime: the fused quantized add / add_relu (int8, 64K, 1M, 16M elements) and
   embedding_byte (int8 32768 x 512 table, 4096 indices, float32 out) against the unfused
   dequantize -> op -> quantize chain, both as .pte programs on the ExecuTorch runtime.
   * fused            etfuse's kernels (QuantFusionPass applied)
   * unfused/stock    the program as exported, executorch's stock quantized kernels for the
                      (de)quantize ops + portable add/relu/embedding (`import
                      executorch.kernels.quantized`), in a subprocess: the stock library cannot
                      share a process with etfuse's quantized kernels (duplicate registrations abort)
   * unfused/etfuse   the same unfused program with etfuse's own quantize/dequantize kernels
                      (add and add_relu only: etfuse has no dequantize_per_channel)
   Each column times `Method.execute()` on inputs set once (the method alone), median of
   repeated runs. Outputs are checked bit-equal between fused and unfused.
2. Pass time: etfuse's QuantFusionPass against executorch's own QuantFusionPass on one edge
   graph of 3,200 dequantize-add-quantize blocks (uint8, which executorch's patterns need;
   16,000 nodes), one run each on a fresh copy.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

qd = torch.ops.quantized_decomposed
SIZES = {"64K": 1 << 16, "1M": 1 << 20, "16M": 1 << 24}
EMB_ROWS, EMB_DIM, EMB_INDICES = 32768, 512, 4096


# ------------------------------------------------------------------------------------------
# programs

class QAdd(torch.nn.Module):
    def __init__(self, relu: bool):
        super().__init__()
        self.relu = relu

    def forward(self, qa, qb):
        x = qd.dequantize_per_tensor.default(qa, 0.02, 3, -128, 127, torch.int8)
        y = qd.dequantize_per_tensor.default(qb, 0.03, -5, -128, 127, torch.int8)
        s = x + y
        if self.relu:
            s = torch.relu(s)
        return qd.quantize_per_tensor.default(s, 0.04, -1, -128, 127, torch.int8)


class QEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-128, 127, (EMB_ROWS, EMB_DIM), dtype=torch.int8, generator=g))
        self.register_buffer("s", torch.rand(EMB_ROWS, generator=g) * 0.01 + 1e-3)
        self.register_buffer("z", torch.randint(-8, 8, (EMB_ROWS,), generator=g))

    def forward(self, idx):
        w = qd.dequantize_per_channel.default(self.w, self.s, self.z, 0, -128, 127, torch.int8)
        return torch.nn.functional.embedding(idx, w)


MODELS = {"embedding_byte_32kx512_4k": QEmbedding}


def build_programs(workdir: Path, sizes: dict) -> list[dict]:
    """Write fused and unfused .pte files and their inputs; returns the cases."""
    from executorch.exir import to_edge

    from etfuse.passes.quant_fusion import QuantFusionPass

    cases = []
    g = torch.Generator().manual_seed(1)
    for label, n in sizes.items():
        qa = torch.randint(-128, 127, (n,), dtype=torch.int8, generator=g)
        qb = torch.randint(-128, 127, (n,), dtype=torch.int8, generator=g)
        for relu in (False, True):
            name = f"{'add_relu' if relu else 'add'}_{label}"
            cases.append(_write(workdir, name, QAdd(relu), (qa, qb), n, etfuse_unfused=True))
    idx = torch.randint(0, EMB_ROWS, (EMB_INDICES,), generator=g)
    cases.append(_write(workdir, "embedding_byte_32kx512_4k", QEmbedding(), (idx,), EMB_INDICES * EMB_DIM,
                        etfuse_unfused=False))
    return cases


def _write(workdir, name, model, inputs, elements, etfuse_unfused):
    from executorch.exir import to_edge

    from etfuse.passes.quant_fusion import QuantFusionPass

    edge = to_edge(torch.export.export(model, inputs))
    p = QuantFusionPass()
    fused = edge.transform([p])
    assert p.report.fused, f"{name}: nothing fused ({p.report.declined})"
    paths = {}
    for kind, prog in (("fused", fused), ("unfused", edge)):
        path = workdir / f"{name}_{kind}.pte"
        try:
            path.write_bytes(prog.to_executorch().buffer)
        except RuntimeError as e:
            # dequantize_per_channel.out exists only where the stock quantized library is
            # loaded: the stock worker lowers this unfused program itself.
            if kind == "fused" or "Missing out variants" not in str(e):
                raise
            path = None
        paths[kind] = str(path) if path else None
    inp = workdir / f"{name}_inputs.pt"
    torch.save(list(inputs), inp)
    return {"name": name, "elements": elements, "inputs": str(inp), "etfuse_unfused": etfuse_unfused, **paths}


# ------------------------------------------------------------------------------------------
# timing (runs in this process or in the stock subprocess)

def time_method(pte: str, inputs: list, min_time: float, min_reps: int):
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method("forward")
    raw = method._method
    raw.set_inputs(list(inputs))
    raw.execute()  # warm-up
    out = [t.clone() for t in raw.get_outputs()]
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        raw.execute()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def worker(mode: str, cases_json: str, result_path: str, min_time: float, min_reps: int) -> None:
    if mode == "stock":
        import executorch.kernels.quantized  # noqa: F401  (stock quantize/dequantize kernels)
        from executorch.extension.pybindings import portable_lib  # noqa: F401
    else:
        import etfuse.kernels

        etfuse.kernels.load()
    cases = json.loads(Path(cases_json).read_text())
    results = {}
    for c in cases:
        inputs = torch.load(c["inputs"])
        if mode == "stock":
            pte = c["unfused"]
            if pte is None:  # lower it here, where dequantize_per_channel.out is defined
                from executorch.exir import to_edge

                pte = c["fused"].replace("_fused.pte", "_unfused.pte")
                prog = to_edge(torch.export.export(MODELS[c["name"]](), tuple(inputs))).to_executorch()
                Path(pte).write_bytes(prog.buffer)
            results[c["name"]] = {"unfused/stock": time_method(pte, inputs, min_time, min_reps)}
        else:
            r = {"fused": time_method(c["fused"], inputs, min_time, min_reps)}
            if c["etfuse_unfused"]:
                r["unfused/etfuse"] = time_method(c["unfused"], inputs, min_time, min_reps)
            results[c["name"]] = r
    torch.save(results, result_path)


def run_worker(mode, cases_file, workdir, min_time, min_reps):
    out = workdir / f"results_{mode}.pt"
    subprocess.run([sys.executable, __file__, "--worker", mode, str(cases_file), str(out),
                    "--min-time", str(min_time), "--min-reps", str(min_reps)], check=True)
    return torch.load(out)


def runtime_benchmark(quick: bool) -> None:
    sizes = {"64K": SIZES["64K"], "1M": SIZES["1M"]} if quick else SIZES
    min_time, min_reps = (0.2, 3) if quick else (1.0, 5)
    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        t0 = time.perf_counter()
        cases = build_programs(workdir, sizes)
        print(f"(built {len(cases)} fused/unfused program pairs in {time.perf_counter() - t0:.1f} s)")
        cases_file = workdir / "cases.json"
        cases_file.write_text(json.dumps(cases))
        # One process per side; etfuse's and the stock quantized kernels never share one.
        ours = run_worker("etfuse", cases_file, workdir, min_time, min_reps)
        stock = run_worker("stock", cases_file, workdir, min_time, min_reps)

    print(f"\nExecuTorch runtime, Method.execute() median, {os.cpu_count()} cores")
    hdr = f"{'case':<28}{'fused':>11}{'unfused/stock':>15}{'unfused/etfuse':>16}{'x vs stock':>12}{'x vs etfuse':>13}  {'fused GB/s':>10}  equal"
    print(hdr)
    print("-" * len(hdr))
    for c in cases:
        name = c["name"]
        f_t, f_out = ours[name]["fused"]
        s_t, s_out = stock[name]["unfused/stock"]
        e = ours[name].get("unfused/etfuse")
        equal = all(torch.equal(a, b) for a, b in zip(f_out, s_out)) and (e is None or all(
            torch.equal(a, b) for a, b in zip(f_out, e[1])))
        bytes_moved = c["elements"] * (3 if name.startswith("add") else 4 + 1)  # int8 a, b, out | int8 row + f32 out
        print(f"{name:<28}{f_t * 1e3:>9.3f}ms{s_t * 1e3:>13.3f}ms"
              f"{(f'{e[0] * 1e3:.3f}ms' if e else '-'):>16}{s_t / f_t:>11.1f}x"
              f"{(f'{e[0] / f_t:.1f}x' if e else '-'):>13}  {bytes_moved / f_t / 1e9:>10.1f}  {equal}")


# ------------------------------------------------------------------------------------------
# pass time

def block_graph(blocks: int):
    """Edge-dialect graph module: `blocks` x (dq(prev), dq(qb), add, q, dq(out)) in uint8."""
    import torch.fx as fx
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    e = exir_ops.edge.quantized_decomposed
    add = exir_ops.edge.aten.add.Tensor
    with FakeTensorMode() as mode:
        qv = torch.empty(64, dtype=torch.uint8)
        fv = torch.empty(64)
    g = fx.Graph()
    qa, qb = g.placeholder("qa"), g.placeholder("qb")
    qa.meta["val"] = qb.meta["val"] = qv
    outs, prev = [], qa

    def node(target, args, val):
        n = g.call_function(target, args)
        n.meta["val"] = val
        return n

    for i in range(blocks):
        s_in = 0.01 + (i % 7) * 0.001
        x = node(e.dequantize_per_tensor.default, (prev, s_in, 128, 0, 255, torch.uint8), fv)
        y = node(e.dequantize_per_tensor.default, (qb, 0.02, 120, 0, 255, torch.uint8), fv)
        s = node(add, (x, y), fv)
        prev = node(e.quantize_per_tensor.default, (s, 0.01 + ((i + 1) % 7) * 0.001, 128, 0, 255, torch.uint8), qv)
        outs.append(node(e.dequantize_per_tensor.default, (prev, 0.01 + ((i + 1) % 7) * 0.001, 128, 0, 255,
                                                          torch.uint8), fv))
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


def pass_benchmark(blocks: int) -> None:
    from executorch.exir.passes.quant_fusion_pass import QuantFusionPass as ExecutorchQuantFusionPass

    from etfuse.passes.quant_fusion import QuantFusionPass

    gm = block_graph(blocks)
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    t0 = time.perf_counter()
    ours = QuantFusionPass()
    t_init = time.perf_counter() - t0
    runs = []
    for _ in range(3):  # cheap enough to repeat: the median of 3 fresh copies (the first is reported too)
        gm1 = copy.deepcopy(gm)
        t0 = time.perf_counter()
        res = ours(gm1)
        runs.append(time.perf_counter() - t0)
    t_ours = runs[0]
    fused_ours = sum(1 for n in res.graph_module.graph.nodes if "quantized_decomposed.add" in str(n.target))
    from etfuse.passes.engine import FusionReport, find_matches

    gm1 = copy.deepcopy(gm)
    t0 = time.perf_counter()
    find_matches(gm1.graph, ours.index, "", FusionReport())
    t_find = time.perf_counter() - t0

    gm2 = copy.deepcopy(gm)
    theirs = ExecutorchQuantFusionPass()
    t0 = time.perf_counter()
    res2 = theirs(gm2)
    t_theirs = time.perf_counter() - t0
    fused_theirs = sum(1 for n in res2.graph_module.graph.nodes if "quantized_decomposed.add" in str(n.target))
    print(f"\nPass time on {blocks} dq-add-q blocks ({nodes} nodes), one run each:")
    print(f"  etfuse QuantFusionPass      {t_ours:8.3f} s  ({fused_ours} adds fused; median of 3: "
          f"{statistics.median(runs):.3f} s; matching alone {t_find:.3f} s, the rest is rebuilding and "
          f"recompiling the graph module; rule lowering in __init__, once per process: {t_init:.2f} s)")
    print(f"  executorch QuantFusionPass  {t_theirs:8.3f} s  ({fused_theirs} adds fused)")
    print(f"  speed-up                    {t_theirs / t_ours:8.1f} x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="64K and 1M only, shorter timing")
    ap.add_argument("--skip-pass", action="store_true")
    ap.add_argument("--skip-runtime", action="store_true")
    ap.add_argument("--blocks", type=int, default=3200)
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "CASES", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--min-time", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--min-reps", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, args.min_time, args.min_reps)
        return
    if not args.skip_runtime:
        runtime_benchmark(args.quick)
    if not args.skip_pass:
        pass_benchmark(args.blocks)


if __name__ == "__main__":
    main()
