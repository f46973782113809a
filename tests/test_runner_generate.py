"""`etfuse_runner --generate`: an LLM's greedy decode loop in the C++ runner (issue 46), on the
program executorch's llama export writes for `-qmode 8da4w` (torchao's 8-bit dynamic activations,
4-bit weights in groups of 32, a KV cache, a dynamic sequence length), fused by etfuse: the
README's app (tests/readme_consumer.py) decodes the same tokens as eager PyTorch does, on x86 and
on ARM64 under qemu; a program that is not an LLM step is refused in one line that says why."""

from __future__ import annotations

import copy
import subprocess

import pytest
import torch
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_

import etfuse
import readme_consumer
from fusion_helpers import example_llama, llama_edge_program, next_token, op_names

PROMPT = [5, 17, 3, 42, 8, 61, 2]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def llama_8da4w(tmp_path_factory):
    """(eager 8da4w llama, its fused dynamic-length .pte's path)."""
    model = example_llama(kv_cache=True, multiple_of=32, dynamic_shape=True)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    fused = etfuse.fuse(llama_edge_program(copy.deepcopy(model), dynamic=True))
    ops = op_names(fused.exported_program().graph_module)
    assert ops.count("etfuse.linear_dq.default") == 2 * 6 + 1 and not [o for o in ops if o.startswith("torchao.")]
    path = tmp_path_factory.mktemp("llm") / "llama_8da4w.pte"
    path.write_bytes(fused.to_executorch().buffer)
    return model, path


def eager_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """The runner's loop in eager PyTorch: the prompt in one call at position 0, then each token
    at the next position."""
    with torch.no_grad():
        token = next_token(model(torch.tensor([prompt]), {"input_pos": torch.tensor([0])}))
        tokens = [token]
        for k in range(1, new_tokens):
            token = next_token(model(torch.tensor([[token]]), {"input_pos": torch.tensor([len(prompt) + k - 1])}))
            tokens.append(token)
    return tokens


def generate(runner: list[str], pte, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*runner, str(pte), *args], capture_output=True, text=True, timeout=600)


def generated_tokens(proc: subprocess.CompletedProcess) -> list[int]:
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in proc.stdout.splitlines())
    assert lines["prefill"].startswith(f"tokens={len(PROMPT)} "), proc.stdout
    assert lines["decode"].startswith(f"tokens={NEW_TOKENS - 1} "), proc.stdout
    assert int(lines["memory"].removeprefix("peak_rss_kib=")) > 1024, proc.stdout  # the process's own peak
    return [int(t) for t in lines["generated:"].split()]


def _aarch64(cpu: str) -> list[str]:
    return ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, str(readme_consumer.app("aarch64"))]


@pytest.mark.parametrize("arch", ["x86", "neoverse-n1"])
def test_the_runner_decodes_an_8da4w_llama_as_eager_does(llama_8da4w, arch):
    model, pte = llama_8da4w
    runner = [str(readme_consumer.app("host"))] if arch == "x86" else _aarch64(arch)
    want = eager_greedy(model, PROMPT, NEW_TOKENS)
    assert len(set(want)) > 1  # a loop that fed one token throughout would not show
    got = generated_tokens(generate(runner, pte, "--generate", str(NEW_TOKENS),
                                    "--prompt", ",".join(map(str, PROMPT))))
    assert got == want


def test_generate_refuses_a_program_that_is_not_an_llm_step(tmp_path):
    class Mlp(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    pte = tmp_path / "mlp.pte"
    pte.write_bytes(etfuse.fuse(etfuse.to_edge(torch.export.export(Mlp(), (torch.randn(2, 3),)))).to_executorch().buffer)
    proc = generate([str(readme_consumer.app("host"))], pte, "--generate", "4")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "--generate" in lines[0] and "takes 1 input(s)" in lines[0] and str(pte) in lines[0]
    proc = generate([str(readme_consumer.app("host"))], pte, "--generate", "4", "--prompt", "1,x")
    assert proc.returncode == 2 and "--prompt takes token ids" in proc.stderr
