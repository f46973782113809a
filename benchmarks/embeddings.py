"""Benchmark the 4-bit embedding kernel on the ExecuTorch runtime.

    python benchmarks/embeddings.py [--rounds 3] [--min-time 1.0]

A 32768 x 512 table of int4 values (per-row scales and zero points, float32 out), 4096 indices:

* etfuse 4bit       `embedding(torchao.dequantize_affine(w, [1, 512], s, zp, int8, -8, 7), idx)` through
                    `etfuse.fuse`: `embedding_4bit` on a packed constant (256 bytes a row), etfuse's kernel
* stock chain       the stock way to run that table without a fused op: `dequantize_per_channel` (executorch's
                    stock quantized kernel, int8 storage) then the portable `embedding`
* stock 4bit        etfuse's fused .pte run on executorch's stock `embedding_4bit.out` kernel

etfuse's and the stock quantized kernels cannot share a process (duplicate registrations abort),
so each side runs in its own subprocess; the rounds alternate the two (etfuse, stock, etfuse, ...)
so both see the same machine load, and each round times `Method.execute()` on inputs set once
(median over `--min-time` seconds). GB/s counts the bytes an ideal gather moves: the selected
packed rows (256 B) + their scale and zero point + the float32 output (2 KiB), per index. Outputs
are checked bit-equal across the three.
"""

from __future__ import annotations

import argparse
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
ROWS, DIM, INDICES = 32768, 512, 4096
BYTES = INDICES * (DIM // 2 + 4 + 4 + DIM * 4)  # packed row, float32 scale and zero point, float32 row out


class Table(torch.nn.Module):
    def __init__(self, stock_chain: bool):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-8, 8, (ROWS, DIM), dtype=torch.int8, generator=g))
        self.register_buffer("s", torch.rand(ROWS, generator=g) * 0.01 + 1e-3)
        self.register_buffer("z", torch.randint(-8, 8, (ROWS,), generator=g))
        self.register_buffer("zf", self.z.float())  # executorch's embedding_4bit.out wants the scales' dtype
        self.stock_chain = stock_chain

    def forward(self, idx):
        if self.stock_chain:
            w = qd.dequantize_per_channel.default(self.w, self.s, self.z, 0, -8, 7, torch.int8)
        else:
            w = torch.ops.torchao.dequantize_affine.default(self.w, [1, DIM], self.s, self.zf, torch.int8, -8, 7)
        return torch.nn.functional.embedding(idx, w)


def build(workdir: Path) -> dict:
    import torchao.quantization.quant_primitives  # noqa: F401  (torchao.dequantize_affine)
    from executorch.exir import to_edge

    import etfuse

    idx = torch.randint(0, ROWS, (INDICES,), generator=torch.Generator().manual_seed(1))
    fused = etfuse.fuse(to_edge(torch.export.export(Table(False), (idx,))))
    ops = [str(n.target._op) for n in fused.exported_program().graph.nodes if n.op == "call_function"]
    assert ops == ["quantized_decomposed.embedding_4bit.default"], ops
    (workdir / "fused.pte").write_bytes(fused.to_executorch().buffer)
    torch.save([idx], workdir / "inputs.pt")
    return {"fused": str(workdir / "fused.pte"), "chain": str(workdir / "chain.pte"), "inputs": str(workdir / "inputs.pt")}


def time_method(pte: str, inputs: list, min_time: float):
    from executorch.runtime import Runtime

    raw = Runtime.get().load_program(pte).load_method("forward")._method
    raw.set_inputs(list(inputs))
    raw.execute()  # warm-up
    out = [t.clone() for t in raw.get_outputs()]
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        raw.execute()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def worker(mode: str, paths_json: str, result_path: str, min_time: float) -> None:
    paths = json.loads(Path(paths_json).read_text())
    inputs = torch.load(paths["inputs"])
    if mode == "stock":
        import executorch.kernels.quantized  # noqa: F401  (stock quantized kernels, embedding_4bit.out among them)
        from executorch.extension.pybindings import portable_lib  # noqa: F401

        if not Path(paths["chain"]).exists():  # lowered here, where dequantize_per_channel.out is defined
            from executorch.exir import to_edge

            prog = to_edge(torch.export.export(Table(True), tuple(inputs))).to_executorch()
            Path(paths["chain"]).write_bytes(prog.buffer)
        res = {"stock chain": time_method(paths["chain"], inputs, min_time),
               "stock 4bit": time_method(paths["fused"], inputs, min_time)}
    else:
        import etfuse.kernels

        etfuse.kernels.load()
        res = {"etfuse 4bit": time_method(paths["fused"], inputs, min_time)}
    torch.save(res, result_path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "PATHS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, args.min_time)
        return
    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        paths_file = workdir / "paths.json"
        paths_file.write_text(json.dumps(build(workdir)))
        rounds = []
        for r in range(args.rounds):
            res = {}
            for mode in ("etfuse", "stock") if r % 2 == 0 else ("stock", "etfuse"):
                out = workdir / f"{mode}_{r}.pt"
                subprocess.run([sys.executable, __file__, "--worker", mode, str(paths_file), str(out),
                                "--min-time", str(args.min_time)], check=True)
                res.update(torch.load(out))
            rounds.append(res)
    outs = [o for _, o in rounds[0].values()]
    equal = all(torch.equal(a[0], outs[0][0]) for a in outs)
    print(f"\n4-bit embedding, {ROWS} x {DIM} table, {INDICES} indices, float32 out; ExecuTorch runtime, "
          f"Method.execute() median per round, {args.rounds} rounds (alternating processes), {os.cpu_count()} cores")
    cols = ["etfuse 4bit", "stock chain", "stock 4bit"]
    print(f"{'round':<7}" + "".join(f"{c:>16}" for c in cols) + f"{'x vs chain':>12}{'x vs stock 4bit':>17}")
    for i, r in enumerate(rounds):
        e = r["etfuse 4bit"][0]
        print(f"{i:<7}" + "".join(f"{r[c][0] * 1e3:>14.3f}ms" for c in cols)
              + f"{r['stock chain'][0] / e:>11.1f}x{r['stock 4bit'][0] / e:>16.1f}x")
    med = {c: statistics.median(r[c][0] for r in rounds) for c in cols}
    print(f"{'median':<7}" + "".join(f"{med[c] * 1e3:>14.3f}ms" for c in cols)
          + f"{med['stock chain'] / med['etfuse 4bit']:>11.1f}x{med['stock 4bit'] / med['etfuse 4bit']:>16.1f}x")
    print(f"{'GB/s':<7}" + "".join(f"{BYTES / med[c] / 1e9:>16.2f}" for c in cols) + f"   outputs equal: {equal}")


if __name__ == "__main__":
    main()
