"""A 1B-class LLM end to end: prefill and decode tokens/s, memory and the bandwidth bound, for
etfuse, XNNPACK and XNNPACK + etfuse, fp32 and 8da4w, at 1 and 2 threads.

    python benchmarks/llm.py [--layers 16] [--dim 2048] [--heads 32] [--kv-heads 8] [--hidden 8192]
                             [--vocab 128256] [--prompt 64] [--decode 128] [--threads 1,2]
                             [--dtypes fp32,8da4w] [--routes etfuse,xnnpack,xnnpack+etfuse]
                             [--rounds 3] [--runner python|cpp] [--keep DIR] [--memory-gib 20]
                             [--baseline REV]

    a small run: python benchmarks/llm.py --layers 2 --dim 256 --vocab 1000 --prompt 16 --decode 8

The model: executorch's example llama (`executorch.examples.models.llama`, construct_transformer +
ModelArgs) with Llama-3.2-1B's shape by default (dim 2048, 16 layers, 32 heads, 8 KV heads, FFN
hidden 8192, vocab 128256), random weights, the output linear tied to the embedding table by
assignment (ModelArgs has no option for it; Llama 3.2 1B ties them), a KV cache, exported as
executorch's llama export does it (`enable_dynamic_shape`, extension/llm/export/builder.py): one
`forward(tokens [1, T], {"input_pos": [1]})`, T a `Dim` up to the prompt length, strict export
under the MATH SDPA backend, then `run_decompositions({})`.

Two weight formats: fp32, and 8da4w as executorch's `-qmode 8da4w` writes it: torchao's
`Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))`
on every linear and the export's own 4-bit embedding (`-E 4,32`: `quantized_decomposed.embedding_4bit`).
Three routes from the same export: etfuse (`etfuse.fuse(to_edge(ep)).to_executorch()`), XNNPACK
(`to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`), XNNPACK + etfuse
(etfuse's rules beside the partitioner, then `etfuse.fuse` on what the delegate leaves).

What it measures, each program (dtype x route) exported in its own process, each timing run in
its own process (the programs and thread counts taking turns, round by round):

* prefill tokens/s: one call on a --prompt-token prompt at position 0 (best of 3 calls);
* decode tokens/s: --decode greedy steps after the prompt (one token each, positions prompt,
  prompt + 1, ...), the whole loop's time;
* peak RSS of the runner process (its VmHWM) and its share above the process before it loaded
  the program (Python, torch and the kernels: the part a C++ runner would not have); with
  `--runner cpp` the runs are `etfuse_runner --generate` (the C++ runner, built once as
  benchmarks/cpp.py builds it): one prefill call, its own timings, the RSS an app has;
* peak RSS of the export process (model, quantization, export, lowering, serialization); `.pte` size;
* the bandwidth bound of decode: bytes of weights a token reads (every linear's weights, the output
  linear included; 8da4w: 4-bit values and float32 scales per group of 32) / the machine's
  bandwidth as etfuse's probe measures it (kernels/csrc/bench/probe.h: a STREAM add on the
  ExecuTorch threadpool, 12 bytes per element) at the same thread count, probed right before and
  right after each timing run (the better of the two): a shared host's bandwidth drifts by a
  quarter within an hour, so each run is paired with its own probe and decode / bound is the
  median of the runs' ratios (their range beside it).

If an export's RSS grows past --memory-gib it is stopped (the machine stays up), the script says so
and measures the most layers that fit (halving), reporting per-layer numbers beside the totals.
`--baseline REV` (with `--runner cpp`) adds the row `etfuse@REV`: the etfuse `.pte` on a second
runner built from git revision REV's kernels (benchmarks/cpp.py's `baseline_runner`), timed in the
same rounds with its own probes, so a kernel change is read as two rows of one run.
A program that does not lower, load or run is a row with its error's first line. Prints a Markdown
table, the CPU model and the machine's load.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
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

DTYPES = ("fp32", "8da4w")
ROUTES = ("etfuse", "xnnpack", "xnnpack+etfuse")
GROUP = 32  # 8da4w's weight groups and the 4-bit embedding's
PREFILL_CALLS = 3


# --- the model and its programs (run in the export process) -----------------------------------


def build_model(cfg: dict, dtype: str):
    """executorch's example llama in cfg's shape, random weights, output tied to the embedding,
    a KV cache for prompt + decode positions, dynamic shape; 8da4w quantized as the export does."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(dim=cfg["dim"], n_layers=cfg["layers"], n_heads=cfg["heads"], n_kv_heads=cfg["kv_heads"],
                     hidden_dim=cfg["hidden"], vocab_size=cfg["vocab"], max_batch_size=1,
                     # the export's Dim is max_seq_len - 1 (builder.py): prompts up to cfg["prompt"]
                     max_seq_len=cfg["prompt"] + 1, max_context_len=cfg["prompt"] + cfg["decode"],
                     use_kv_cache=True, enable_dynamic_shape=True)
    model = construct_transformer(args).eval()
    model.output.weight = model.tok_embeddings.weight
    for p in model.parameters():  # export keeps requires_grad into the mutable KV buffers otherwise
        p.requires_grad_(False)
    if dtype == "8da4w":
        from executorch.examples.models.llama.source_transformation.quantize import get_quant_embedding_transform
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        model = get_quant_embedding_transform(f"4,{GROUP}")(model)  # the export's order: embedding first
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                               weight_granularity=PerGroup(GROUP)))
    return model


def export(model, prompt: int):
    """executorch's llama export (LLMEdgeManager._export): strict, MATH SDPA, no grad, tokens'
    length a Dim up to the prompt, then run_decompositions({})."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    example = (torch.tensor([[2, 3, 4]]), {"input_pos": torch.tensor([0])})
    dynamic = ({1: torch.export.Dim("token_dim", max=prompt)}, {"input_pos": {0: 1}})
    with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        ep = torch.export.export(model, example, dynamic_shapes=dynamic, strict=True)
        return ep.run_decompositions({})


def lower(ep, route: str) -> bytes:
    """The route's .pte. Takes the caller's only reference to `ep` (a one-item list, emptied): each
    stage drops the one before it, so the unpacked weights are freed before serialization copies
    the packed ones (the 1B fp32 export was killed at 17.4 GiB holding all of them at once)."""
    import gc

    import etfuse
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
    from etfuse.passes import passes_beside_xnnpack

    config = EdgeCompileConfig(_check_ir_validity=False)
    program = ep.pop()
    if route == "etfuse":
        program = to_edge(program, compile_config=config)
    else:
        program = to_edge_transform_and_lower(
            program, partitioner=[XnnpackPartitioner()], compile_config=config,
            **({"transform_passes": passes_beside_xnnpack()} if route == "xnnpack+etfuse" else {}))
    if route != "xnnpack":
        program = etfuse.fuse(program)
    gc.collect()
    return program.to_executorch().buffer


def program_ops(pte: bytes) -> dict:
    """Operator name -> count of calls in the program's instructions, delegates as `delegate`."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte)
    program = getattr(program, "program", program)
    plan = program.execution_plan[0]
    counts = {}
    for chain in plan.chains:
        for ins in chain.instructions:
            args = ins.instr_args
            if hasattr(args, "op_index"):
                name = plan.operators[args.op_index].name
            elif hasattr(args, "delegate_index"):
                name = "delegate"
            else:
                continue
            counts[name] = counts.get(name, 0) + 1
    return counts


def prompt_tokens(cfg: dict):
    import torch

    return torch.randint(1, cfg["vocab"], (1, cfg["prompt"]), generator=torch.Generator().manual_seed(0))


def export_job(cfg: dict, dtype: str, route: str, out: str) -> dict:
    """Build, quantize, export and lower one program into `out`; what it holds. The eager model's
    logits on the prompt go to `out`.logits.pt (before export, the caches emptied after)."""
    import torch

    model = build_model(cfg, dtype)
    with torch.no_grad():  # eager's logits first, so the model can go before lowering
        torch.save(model(prompt_tokens(cfg), {"input_pos": torch.tensor([0])}), out + ".logits.pt")
    for name, buffer in model.named_buffers():  # the prompt's keys and values out of the caches again
        if name.endswith(("k_cache", "v_cache")):
            buffer.zero_()
    ep = [export(model, cfg["prompt"])]
    del model
    pte = lower(ep, route)
    Path(out).write_bytes(pte)
    ops = program_ops(pte)
    return {"pte_bytes": len(pte), "linear_dq": ops.get("etfuse::linear_dq", 0),
            "etfuse_ops": sum(n for k, n in ops.items() if k.startswith("etfuse::")),
            "delegates": ops.get("delegate", 0),
            "foreign": sorted(k for k in ops if k.startswith(("torchao::", "quantized_decomposed::choose")))}


# --- one program on the runtime (run in the runner process) -----------------------------------


def rss_kib(field: str = "VmRSS") -> int:
    """This process's resident set (VmRSS) or its peak (VmHWM), KiB. Not `ru_maxrss`: Linux keeps
    it across exec, so a child's starts at its parent's peak."""
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))


def run_job(pte: str, threads: int, cfg: dict) -> dict:
    """Prefill on a prompt (best of PREFILL_CALLS calls, each from position 0; the first one's
    logits against eager's), then `decode` greedy steps; seconds, and the process's peak RSS."""
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    import etfuse.kernels

    torch.set_num_threads(1)  # torch only makes the inputs here; its workers would spin on the cores
    portable_lib._unsafe_reset_threadpool(threads)
    etfuse.kernels.load()
    before = rss_kib()
    method = Runtime.get().load_program(pte).load_method("forward")
    prompt, decode, vocab = cfg["prompt"], cfg["decode"], cfg["vocab"]
    tokens, want = prompt_tokens(cfg), torch.load(pte + ".logits.pt")
    prefill = []
    for _ in range(PREFILL_CALLS):
        t0 = time.perf_counter()
        logits = method.execute((tokens, torch.tensor([0])))[0]
        prefill.append(time.perf_counter() - t0)
        if len(prefill) == 1:
            rel_error = float((logits - want).abs().max() / want.abs().max())
    token = int(logits.reshape(-1, vocab)[-1].argmax())
    t0 = time.perf_counter()
    for pos in range(prompt, prompt + decode):
        logits = method.execute((torch.tensor([[token]]), torch.tensor([pos])))[0]
        token = int(logits.reshape(-1)[-vocab:].argmax())
    decode_s = time.perf_counter() - t0
    return {"prefill_s": min(prefill), "decode_s": decode_s, "rel_error": rel_error,
            "peak_kib": rss_kib("VmHWM"), "before_kib": before}


def cpp_run_job(runner: str, pte: str, threads: int, cfg: dict) -> dict:
    """The same prefill and decode through the C++ runner (`etfuse_runner --generate`: the Module
    API, as an app runs it; no Python in the process): one prefill call, then `decode` steps; the
    runner's own timings, and its peak RSS read from /proc while it runs (its VmHWM)."""
    prompt = ",".join(str(int(t)) for t in prompt_tokens(cfg)[0])
    proc = subprocess.Popen([runner, pte, "--generate", str(cfg["decode"] + 1), "--prompt", prompt,
                             "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, next(int(line.split()[1]) for line in open(f"/proc/{proc.pid}/status")
                                  if line.startswith("VmHWM:")))
        except (OSError, StopIteration):
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}")
    fields = {line.split()[0]: dict(f.split("=") for f in line.split()[1:] if "=" in f) for line in out.splitlines()}
    if "memory" in fields:  # the runner's own VmHWM: a run shorter than one poll is seen too
        peak = int(fields["memory"]["peak_rss_kib"])
    return {"prefill_s": float(fields["prefill"]["ms"]) / 1e3, "decode_s": float(fields["decode"]["ms"]) / 1e3,
            "rel_error": None, "peak_kib": peak, "before_kib": 0}


# --- the parent: processes, memory, bandwidth --------------------------------------------------


def child(job: str, payload: dict, memory_gib: float = None) -> dict:
    """This script in a new process (`--child job`), its JSON answer (with the process's peak RSS);
    a failure is {"error": its first line}. The process is stopped when its RSS passes
    `memory_gib` ({"oom": GiB when stopped}), before the machine runs out."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", job, json.dumps(payload)], stdout=out,
                                stderr=err, text=True)
        rss = 0
        while proc.poll() is None:
            try:
                rss = next(int(line.split()[1]) for line in open(f"/proc/{proc.pid}/status")
                           if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                pass
            if memory_gib is not None and rss > memory_gib * 2**20:
                proc.kill()
                proc.wait()
                return {"oom": rss / 2**20}
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        answers = [line for line in out.read().splitlines() if line.startswith("{")]
        if answers:
            return json.loads(answers[-1])
        lines = [line for line in err.read().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit code {proc.returncode}")[:200]}


def child_main(job: str, payload: str) -> int:
    p = json.loads(payload)
    try:
        if job == "export":
            answer = export_job(p["cfg"], p["dtype"], p["route"], p["out"])
        elif p.get("runner"):
            answer = cpp_run_job(p["runner"], p["pte"], p["threads"], p["cfg"])
        else:
            answer = run_job(p["pte"], p["threads"], p["cfg"])
    except Exception as e:  # the table says what went wrong, in one line
        answer = {"error": (f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")[:200]}
    answer.setdefault("peak_kib", rss_kib("VmHWM"))
    print(json.dumps(answer), flush=True)
    return 0


def weight_bytes_per_token(cfg: dict, dtype: str) -> float:
    """Bytes of weights one decode step reads: every linear (q, k, v, o, the MLP's three, the
    output), fp32 or 4-bit values with a float32 scale per group; the embedding's one row."""
    head = cfg["dim"] // cfg["heads"]
    per_layer = cfg["dim"] * head * (2 * cfg["heads"] + 2 * cfg["kv_heads"]) + 3 * cfg["dim"] * cfg["hidden"]
    linear = cfg["layers"] * per_layer + cfg["vocab"] * cfg["dim"]
    if dtype == "fp32":
        return 4.0 * (linear + cfg["dim"])
    return linear * (0.5 + 4 / GROUP) + cfg["dim"] * (0.5 + 4 / GROUP)


def bandwidth_gbs(threads: int, n: int = 1 << 24, reps: int = 7) -> float:
    """The probe's GB/s (STREAM add over three n-float arrays, 12 bytes per element) on the
    ExecuTorch threadpool at `threads`."""
    import torch
    from executorch.extension.pybindings import portable_lib

    import etfuse.kernels as kernels

    kernels.load()
    fn = ctypes.CDLL(str(kernels.build.probe_library())).etfuse_probe_stream_add
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    default = portable_lib._threadpool_get_thread_count()
    portable_lib._unsafe_reset_threadpool(threads)
    try:
        fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), n, 2)  # first touch
        return 12 * n / fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), n, reps) / 1e9
    finally:
        portable_lib._unsafe_reset_threadpool(default)


def cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or platform.machine()


def available_gib() -> float:
    return next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemAvailable:")) / 2**20


def export_all(cfg: dict, dtypes, routes, workdir: Path, memory_gib: float) -> tuple[dict, int, list]:
    """Every program exported at cfg's layers, or at the most layers (halving) whose every export
    stays under memory_gib; (results by (dtype, route), layers, the layer counts that did not fit)."""
    layers, too_big = cfg["layers"], []
    while True:
        results = {}
        for dtype, route in itertools.product(dtypes, routes):
            out = workdir / f"{dtype}_{route.replace('+', '_')}.pte"
            job = {"cfg": {**cfg, "layers": layers}, "dtype": dtype, "route": route, "out": str(out)}
            record = out.with_suffix(".json")  # --keep: an export of the same job is reused
            kept = json.loads(record.read_text()) if record.is_file() and out.is_file() else {}
            reused = kept.get("job") == job
            r = kept["result"] if reused else child("export", job, memory_gib)
            if not {"error", "oom"} & r.keys():
                record.write_text(json.dumps({"job": job, "result": r}))
            results[dtype, route] = {**r, "path": str(out)}
            outcome = r.get("error") or (f"stopped at {r['oom']:.1f} GiB" if "oom" in r else
                                         f"ok{f' (kept from an earlier run, {out})' if reused else ''}")
            print(f"<!-- exported {dtype} {route} at {layers} layers: {outcome} -->", flush=True)
            if "oom" in r and layers > 1:
                break
        stopped = [r for r in results.values() if "oom" in r]
        if not stopped or layers == 1:
            return results, layers, too_big
        too_big.append(layers)
        layers //= 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=8192, help="the MLP's hidden size")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--prompt", type=int, default=64, help="prefill tokens (the Dim's upper bound)")
    ap.add_argument("--decode", type=int, default=128, help="decode steps after the prompt")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--routes", default=",".join(ROUTES))
    ap.add_argument("--rounds", type=int, default=3, help="timing runs per program and thread count (median)")
    ap.add_argument("--runner", choices=("python", "cpp"), default="python",
                    help="time on executorch's Python runtime (checks the logits against eager) or through "
                         "etfuse_runner --generate (C++, the RSS an app has; built once, benchmarks/cpp.py)")
    ap.add_argument("--keep", metavar="DIR",
                    help="export the programs into DIR and keep them; a later run with the same model, dtype and "
                         "route reuses them (timing a kernel change without exporting again)")
    ap.add_argument("--memory-gib", type=float, default=20.0,
                    help="an export whose RSS passes this is stopped and fewer layers are measured")
    ap.add_argument("--baseline", metavar="REV",
                    help="with --runner cpp: also time the etfuse .pte on a runner built from REV's kernels")
    args = ap.parse_args(argv)
    if args.child:
        return child_main(*args.child)
    if args.baseline and args.runner != "cpp":
        ap.error("--baseline times a second C++ runner: it needs --runner cpp")
    if args.baseline and "etfuse" not in args.routes.split(","):
        ap.error("--baseline times the etfuse .pte on REV's kernels: it needs the route etfuse in --routes")

    cfg = dict(layers=args.layers, dim=args.dim, heads=args.heads, kv_heads=args.kv_heads, hidden=args.hidden,
               vocab=args.vocab, prompt=args.prompt, decode=args.decode)
    dtypes, routes = args.dtypes.split(","), args.routes.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    load_start = os.getloadavg()
    print(f"# etfuse LLM benchmark\n\n{cpu_model()}, {os.cpu_count()} CPUs, load average "
          f"{load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f} (1 / 5 / 15 min) at the start\n", flush=True)
    memory_gib = min(args.memory_gib, available_gib() - 1)  # a shared machine: leave the others theirs
    runner, runners = None, {}
    if args.runner == "cpp":
        sys.path.insert(0, str(Path(__file__).parent))
        from cpp import baseline_runner, build_runner

        build_dir = Path(tempfile.gettempdir()) / "etfuse-bench-runner"
        runner = str(build_runner(build_dir))
        if args.baseline:  # the same etfuse program, REV's kernels
            runners[f"etfuse@{args.baseline}"] = str(baseline_runner(args.baseline, build_dir))
    print(f"exports are stopped past {memory_gib:.1f} GiB of RSS\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        exported, layers, too_big = export_all(cfg, dtypes, routes, workdir, memory_gib)
        cfg["layers"] = layers
        baselines = list(runners)
        timed = routes + baselines
        for d, r in itertools.product(dtypes, baselines):
            exported[d, r] = exported[d, "etfuse"]
        jobs = [(d, r, t) for d in dtypes for r in timed for t in threads
                if not {"error", "oom"} & exported[d, r].keys()]
        samples = {job: [] for job in jobs}
        for k in range(args.rounds):  # each round starts one program later: no place in the round is a bias
            for job in jobs[k % len(jobs):] + jobs[:k % len(jobs)] if jobs else []:
                d, r, t = job
                before = bandwidth_gbs(t)  # each run's own bound: the probes on either side of it
                s = child("run", {"pte": exported[d, r]["path"], "threads": t, "cfg": cfg,
                                  "runner": runners.get(r, runner)})
                samples[job].append({**s, "probe_gbs": max(before, bandwidth_gbs(t))})
    probes = {t: [s["probe_gbs"] for (_, _, jt), runs in samples.items() if jt == t for s in runs] for t in threads}
    bandwidth = {t: statistics.median(probes[t]) if probes[t] else bandwidth_gbs(t) for t in threads}
    note = (f"An export at {' and at '.join(map(str, too_big))} layers passed the {memory_gib:.1f} GiB cap on RSS: "
            if too_big else "")
    print_table(cfg, dtypes, timed, threads, exported, samples, bandwidth, note, args.layers)
    load_end = os.getloadavg()
    print(f"\nload average at the end {load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f}")
    return 0


def print_table(cfg, dtypes, routes, threads, exported, samples, bandwidth, note, asked_layers) -> None:
    per_layer = cfg["layers"] != asked_layers
    weights_mb = " / ".join(f"{weight_bytes_per_token(cfg, d) / 1e6:,.1f} ({d})" for d in dtypes)
    cache_resident = min(weight_bytes_per_token(cfg, d) for d in dtypes) < 64e6
    print(f"\nllama: dim {cfg['dim']}, {cfg['layers']} layers, {cfg['heads']} heads, {cfg['kv_heads']} KV heads, "
          f"FFN {cfg['hidden']}, vocab {cfg['vocab']}, tied output; prompt {cfg['prompt']} tokens, decode "
          f"{cfg['decode']}; medians of the runs. Bandwidth (probe, STREAM add, around each run; median): "
          + ", ".join(f"{bandwidth[t]:.1f} GB/s at {t} thread{'s' * (t > 1)}" for t in threads)
          + f". Bound: {weights_mb} MB of weights per token / that bandwidth; decode / bound: the median of "
          "each run's decode over its own probes' bound (the runs' range)"
          + (" (at this size they fit in the caches: no bound)" if cache_resident else "")
          + ". Prefill and decode: the median (the runs' range)"
          + ". Error vs eager: max |logits - eager's| / max |eager's| of the first prefill.\n")
    if per_layer:
        print(f"**{note}measured at {cfg['layers']} layer{'s' * (cfg['layers'] > 1)} instead of {asked_layers}; "
              "the ms-per-layer columns "
              "are decode and prefill time per token divided by the layers (the output linear included).**\n")
    extra = " decode ms/token/layer | prefill ms/token/layer |" if per_layer else ""
    print("| dtype | route | threads | prefill tok/s | decode tok/s | decode bound tok/s | decode / bound |"
          " runner peak RSS MiB (above start) | export peak RSS MiB | .pte MB | error vs eager | ops |" + extra)
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * (2 * per_layer))
    for d in dtypes:
        weights = weight_bytes_per_token(cfg, d)
        for r in routes:
            e = exported[d, r]
            if "error" in e or "oom" in e:
                why = e.get("error") or f"export stopped at {e['oom']:.1f} GiB"
                print(f"| {d} | {r} | - | does not lower: {why} |" + " |" * (8 + 2 * per_layer))
                continue
            ops = (f"{e['linear_dq']} linear_dq, " if d == "8da4w" else "") + \
                f"{e['etfuse_ops']} etfuse, {e['delegates']} delegate calls"
            if e["foreign"]:
                ops += "; left: " + ", ".join(e["foreign"])
            for t in threads:
                runs = samples.get((d, r, t), [])
                errors = [s["error"] for s in runs if "error" in s]
                ok = [s for s in runs if "error" not in s]
                head = f"| {d} | {r} | {t} |"
                error = statistics.median(s["rel_error"] for s in ok) if ok and ok[0]["rel_error"] is not None else None
                tail = (f" {e['peak_kib'] / 1024:,.0f} | {e['pte_bytes'] / 1e6:,.1f} | "
                        f"{'-' if error is None else f'{error:.1e}'} | {ops} |")
                bounds = [s["probe_gbs"] * 1e9 / weights for s in runs]
                bound = statistics.median(bounds) if bounds else bandwidth[t] * 1e9 / weights
                if not ok:
                    print(f"{head} does not run: {errors[0] if errors else 'no runs'} | | {bound:.1f} | | |{tail}"
                          + " |" * (2 * per_layer))
                    continue
                prefills = [cfg["prompt"] / s["prefill_s"] for s in ok]
                decodes = [cfg["decode"] / s["decode_s"] for s in ok]
                prefill, decode = statistics.median(prefills), statistics.median(decodes)
                ratios = [cfg["decode"] / s["decode_s"] / (s["probe_gbs"] * 1e9 / weights) for s in ok]
                peak = statistics.median(s["peak_kib"] for s in ok) / 1024
                above = statistics.median(s["peak_kib"] - s["before_kib"] for s in ok) / 1024
                ratio = f"{statistics.median(ratios):.0%} ({min(ratios):.0%}-{max(ratios):.0%})"
                row = (f"{head} {prefill:.1f} ({min(prefills):.0f}-{max(prefills):.0f}) | "
                       f"{decode:.1f} ({min(decodes):.1f}-{max(decodes):.1f}) | {bound:.1f} | {ratio} | "
                       f"{peak:,.0f} ({above:,.0f}) |{tail}")
                if per_layer:
                    row += (f" {1e3 / decode / cfg['layers']:.2f} | {1e3 / prefill / cfg['layers']:.3f} |")
                if errors:
                    row += f" ({len(errors)} runs failed: {errors[0]})"
                print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
