"""Transformers end to end: stock portable runtime, etfuse, XNNPACK, XNNPACK + etfuse.

    python benchmarks/transformers.py [--models llama_prefill,llama_decode,...] [--rounds 5] [--top 4] [--without a,b]

The models: executorch's example llama (`executorch.examples.models.llama`, random init) in the
issue's tiny config (dim 288, 6 layers, 6 heads, vocab 512) and a larger one (dim 1024, 8 layers,
16 heads, 4 KV heads), each as a 16-token prefill without a KV cache and as a one-token decode
with a KV cache (its mutable buffers updated in place by the runtime). `vit_b16_96`: a standard
ViT-B/16 (timm's layout, written from torch blocks: torchvision is not installable here) on a
1x3x96x96 image, random init. `mobilebert`: transformers' MobileBertModel, default config, random
init, on 8 token ids (its last hidden state); skipped with a line where transformers is missing.

For each model: the four programs lowered from one `torch.export`, each checked against eager
(relative max error of the logits), timed on the ExecuTorch runtime interleaved in batches
(median; benchmarks/kernels.py), torch eager timed apart; the etfuse program's top ops by ETDump
time. Prints a Markdown table and the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import etfuse  # noqa: E402
import etfuse.kernels as kernels  # noqa: E402

_spec = importlib.util.spec_from_file_location("_etfuse_bench_models", Path(__file__).with_name("models.py"))
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)
lowered, interleaved, runtime_ms = _models.lowered, _models.interleaved, _models.runtime_ms

TINY = dict(dim=288, n_layers=6, n_heads=6, vocab_size=512)
LARGE = dict(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, vocab_size=4096)
PREFILL = 16
BERT_TOKENS = 8


def llama(config: dict, kv_cache: bool):
    """An example llama, random init, and its example inputs: 16 tokens, or 1 token at position 5."""
    def make():
        from executorch.examples.models.llama.llama_transformer import construct_transformer
        from executorch.examples.models.llama.model_args import ModelArgs

        torch.manual_seed(0)
        model = construct_transformer(ModelArgs(**config, max_seq_len=128, max_context_len=128, multiple_of=32,
                                                use_kv_cache=kv_cache)).eval()
        for p in model.parameters():  # export keeps requires_grad into the mutable KV buffers otherwise
            p.requires_grad_(False)
        if kv_cache:
            return model, (torch.tensor([[3]]), {"input_pos": torch.tensor([5])})
        return model, (torch.randint(0, config["vocab_size"], (1, PREFILL), generator=torch.Generator().manual_seed(0)),)
    return make


class VitAttention(torch.nn.Module):
    """Multi-head self-attention the timm way: one qkv linear, reshape/permute/unbind, SDPA, proj."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class VitBlock(torch.nn.Module):
    """Pre-norm encoder block: x + attn(norm1(x)), then x + mlp(norm2(x)) with a GELU MLP."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim, eps=1e-6)
        self.attn = VitAttention(dim, heads)
        self.norm2 = torch.nn.LayerNorm(dim, eps=1e-6)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(torch.nn.Module):
    """ViT-B/16 by default: 16x16 patches (a stride-16 conv), class token, learned position
    embedding, pre-norm blocks, final norm, a linear head on the class token."""

    def __init__(self, image=96, patch=16, dim=768, depth=12, heads=12, hidden=3072, classes=1000):
        super().__init__()
        self.patch_embed = torch.nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = torch.nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = torch.nn.Sequential(*[VitBlock(dim, heads, hidden) for _ in range(depth)])
        self.norm = torch.nn.LayerNorm(dim, eps=1e-6)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [B, patches, dim]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class LastHidden(torch.nn.Module):
    """A transformers encoder as a function of its token ids: its last hidden state (the
    benchmark's "logits"; export drops the unused pooler)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def import_transformers():
    """The `transformers` package, or None where it is not installed. This script is itself
    benchmarks/transformers.py: run as a script its folder is first on sys.path, where a plain
    import would find the script, so the folder is left out while importing."""
    here = str(Path(__file__).resolve().parent)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    try:
        import transformers
    except ImportError:
        return None
    finally:
        sys.path[:] = saved
    return transformers


def mobilebert():
    """transformers' MobileBertModel, default config (24 layers, hidden 512, bottleneck 128, 4
    heads, 4 feed-forward networks, NoNorm, relu), random init, on 8 token ids, batch 1."""
    transformers = import_transformers()
    torch.manual_seed(0)
    config = transformers.MobileBertConfig()
    model = LastHidden(transformers.MobileBertModel(config)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.randint(0, config.vocab_size, (1, BERT_TOKENS), generator=torch.Generator().manual_seed(0))
    return model, (ids,)


def vit_b16(image: int):
    def make():
        torch.manual_seed(0)
        return VisionTransformer(image=image).eval(), (torch.randn(1, 3, image, image),)
    return make


ZOO = {
    "llama_prefill": llama(TINY, kv_cache=False),
    "llama_decode": llama(TINY, kv_cache=True),
    "llama_large_prefill": llama(LARGE, kv_cache=False),
    "llama_large_decode": llama(LARGE, kv_cache=True),
    "vit_b16_96": vit_b16(96),
    "mobilebert": mobilebert,
}
NEEDS = {"mobilebert": "transformers"}  # models that need a package CI does not install


QUANTIZED = {"llama_decode": "llama_decode", "llama_large_decode": "llama_large_decode",
             "llama_large_prefill": "llama_large_prefill"}


def weight_only(model, bits: int):
    """`model` with its linears' weights quantized by torchao's IntxWeightOnlyConfig (in place):
    int8 per output channel, or int4 in groups of 32 columns; symmetric, as torchao's default."""
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_

    granularity = PerAxis(0) if bits == 8 else PerGroup(32)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=granularity))
    return model


def quantized_table(names: list, rounds: int, tmp: Path) -> None:
    """fp32 / int8 / int4 etfuse programs of each model, timed interleaved; the stock portable
    runtime and XNNPACK do not run `torchao.dequantize_affine`, so etfuse's own fp32 program is
    the baseline."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.runtime import Runtime

    print("\n## Weight-only quantized linears (torchao IntxWeightOnlyConfig: int8 per channel, int4 groups "
          "of 32)\n")
    print("| model | fp32 ms | int8 ms | int4 ms | fp32 / int8 | fp32 / int4 | .pte MB fp32 / int8 / int4 "
          "| error int8 / int4 (vs its eager) | int4 top ops (ETDump share) |")
    print("|---|---:|---:|---:|---:|---:|---|---|---|")
    for name in names:
        model, example = ZOO[name]()
        inputs = flat(example)
        methods, programs, errors = {}, {}, {}
        for variant in ("fp32", "int8", "int4"):
            m = copy.deepcopy(model)
            if variant != "fp32":
                weight_only(m, int(variant[-1]))
            with torch.no_grad():
                want = copy.deepcopy(m)(*example)
            edge = to_edge(torch.export.export(m, example),
                           compile_config=EdgeCompileConfig(_check_ir_validity=False))
            programs[variant] = etfuse.fuse(edge).to_executorch().buffer
            path = tmp / f"{name}_{variant}.pte"
            path.write_bytes(programs[variant])
            methods[variant] = Runtime.get().load_program(str(path)).load_method("forward")
            got = methods[variant].execute(inputs)[0]
            errors[variant] = float((got - want).abs().max() / want.abs().max())
        ms = {k: 1e3 * v for k, v in interleaved({k: runtime_exec(m, inputs) for k, m in methods.items()},
                                                  rounds, 0.2).items()}
        prof = etfuse.profile(programs["int4"], inputs, runs=2)
        top = ", ".join(f"{r.op.split('::')[-1]} {100 * r.share:.0f}%" for r in list(prof)[:4])
        mb = " / ".join(f"{len(programs[k]) / 1e6:.1f}" for k in ("fp32", "int8", "int4"))
        print(f"| {name} | {ms['fp32']:.2f} | {ms['int8']:.2f} | {ms['int4']:.2f} | {ms['fp32'] / ms['int8']:.2f}x | "
              f"{ms['fp32'] / ms['int4']:.2f}x | {mb} | {errors['int8']:.1e} / {errors['int4']:.1e} | {top} |",
              flush=True)


def flat(args) -> tuple:
    """The runtime's positional inputs for export's (args, kwargs-dict) example."""
    out = []
    for a in args:
        out.extend(a.values() if isinstance(a, dict) else [a])
    return tuple(out)


def runtime_exec(method, inputs):
    """`Method.execute()` with its inputs set on every call: memory planning may reuse an input's
    buffer once the input is dead (the token ids are read once, by the embedding)."""
    raw, inputs = method._method, list(inputs)

    def run():
        raw.set_inputs(inputs)
        raw.execute()
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, from: {', '.join(ZOO)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=4, help="top ops of the etfuse program (ETDump) to print")
    ap.add_argument("--stock", action="store_true", help="time the stock portable program too (slow)")
    ap.add_argument("--quantized", default=",".join(QUANTIZED),
                    help="comma-separated models to time as fp32 / int8 / int4 weight-only etfuse programs ('' for none)")
    ap.add_argument("--without", default="", help="comma-separated rule-name parts: also time etfuse without the "
                                                  "rules whose names contain them (what those rules buy; "
                                                  "prepack: without PrepackWeightsPass)")
    ap.add_argument("--isolated", action="store_true",
                    help="time each .pte in its own process, the programs taking turns (slower to run; in one "
                         "process the loaded programs share the caches)")
    args = ap.parse_args(argv)
    without = tuple(w for w in args.without.split(",") if w)
    info = kernels.load()
    print(f"# etfuse transformer benchmark\n\n{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the "
          f"start, kernels ISA {info.isa}, runtime threads {info.runtime_threads}; ms per forward, medians of "
          f"{args.rounds} {'rounds, each program in its own process' if args.isolated else 'interleaved rounds'}; "
          "error: max |runtime - eager| / max |eager| of the logits\n")
    print("| model | stock | etfuse | XNNPACK | XNNPACK + etfuse | eager | etfuse / XNNPACK | XNNPACK+etfuse / XNNPACK "
          "| etfuse error | etfuse top ops (ETDump share) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in [n for n in args.models.split(",") if n]:
            if NEEDS.get(name) == "transformers" and import_transformers() is None:
                print(f"| {name} | skipped: `transformers` is not installed (pip install \".[bench]\") |", flush=True)
                continue
            model, example = ZOO[name]()
            inputs = flat(example)
            # a KV-cache model mutates its buffers: eager runs on a copy so every program starts equal
            with torch.no_grad():
                want = copy.deepcopy(model)(*example)
            programs, methods = lowered(model, example, Path(tmp), name, args.stock, without)
            errors = {}
            for k, m in methods.items():
                got = m.execute(inputs)[0]
                errors[k] = float((got - want).abs().max() / want.abs().max())
            ms = runtime_ms(methods, programs, inputs, args.rounds, Path(tmp), name, args.isolated)
            eager_model = copy.deepcopy(model)
            with torch.no_grad():
                ms["eager"] = 1e3 * interleaved({"e": lambda: eager_model(*example)}, args.rounds, 0.2)["e"]
            prof = etfuse.profile(programs["etfuse"], inputs, runs=2)
            top = ", ".join(f"{r.op.split('::')[-1]} {100 * r.share:.0f}%" for r in list(prof)[:args.top])
            if without:
                top += (f"; etfuse without {', '.join(without)}: {ms['etfuse without']:.2f} ms "
                        f"({ms['etfuse without'] / ms['xnnpack']:.2f}x XNNPACK's time)")
            stock = f"{ms['stock']:.2f}" if "stock" in ms else "-"
            print(f"| {name} | {stock} | {ms['etfuse']:.2f} | {ms['xnnpack']:.2f} | {ms['xnnpack+etfuse']:.2f} | "
                  f"{ms['eager']:.2f} | {ms['etfuse'] / ms['xnnpack']:.2f}x | {ms['xnnpack+etfuse'] / ms['xnnpack']:.2f}x "
                  f"| {errors['etfuse']:.1e} | {top} |", flush=True)
        if args.quantized:
            quantized_table(args.quantized.split(","), args.rounds, Path(tmp))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
