"""The deployment cases (tests/deploy_models.py): each fused `.pte` against eager PyTorch on the
Python ExecuTorch runtime, then through the C++ app the README's "Deploying to a device" builds
(tests/readme_consumer.py: its CMakeLists.txt and build commands, verbatim, with etfuse_runner's
source as main.cpp; etfuse::kernels and executorch::kernels_optimized only), natively on x86 and,
cross-compiled with the README's aarch64 commands, under qemu-aarch64 for two CPU models."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch

import readme_consumer
from deploy_models import CASES, DeployCase, read_outputs, write_case
from etfuse.runtime import run

NAMES = list(CASES)

# The kernels each program needs from etfuse: what the runner must have registered, and proof
# that each model fused the way it is meant to.
ETFUSE_OPS = {
    "cnn": {"etfuse::conv2d_bn_act.out", "etfuse::max_pool2d.out", "etfuse::mean_hw.out", "etfuse::linear_act.out"},
    "depthwise_separable": {"etfuse::conv2d_bn_act.out", "etfuse::conv2d_bn_packed_act.out", "etfuse::mean_hw.out",
                            "etfuse::linear_act.out"},
    "transformer_block": {"etfuse::layer_norm.out", "etfuse::linear_packed_act.out", "etfuse::permute_copy.out",
                          "etfuse::sdpa.out"},
    "int8_pt2e_cnn": {"etfuse::quantized_decomposed_quantize_per_tensor.out", "etfuse::quantized_conv2d.out",
                      "etfuse::quantized_decomposed_add.out", "etfuse::max_pool2d.out", "etfuse::mean_hw.out",
                      "etfuse::quantized_linear_packed.out", "etfuse::quantized_decomposed_dequantize_per_tensor.out"},
    "int4_llama_decode": {"etfuse::rms_norm.out", "etfuse::linear_qw.out", "etfuse::rope.out",
                          "etfuse::update_cache_", "etfuse::sdpa.out"},
    # one program: both branches' ops are in its plan
    "cond_then": {"etfuse::add_relu.out", "etfuse::linear_relu.out"},
    "cond_else": {"etfuse::add_relu.out", "etfuse::linear_relu.out"},
    "quantized_embeddings": {"etfuse::quantized_decomposed_embedding_byte.out",
                             "etfuse::quantized_decomposed_embedding_4bit.out",
                             "etfuse::quantized_decomposed_embedding_2bit.out"},
}


def _assert_matches(got: list[torch.Tensor], case: DeployCase):
    assert len(got) == len(case.expected), case.name
    for g, want in zip(got, case.expected):
        assert g.dtype == want.dtype and g.shape == want.shape, (case.name, g.dtype, g.shape)
        torch.testing.assert_close(g, want, atol=case.atol, rtol=case.rtol, msg=lambda m: f"{case.name}: {m}")


def test_every_case_has_its_ops():
    assert set(NAMES) == set(ETFUSE_OPS)


@pytest.mark.parametrize("name", NAMES)
def test_cases_hold_their_fused_ops(name):
    case = CASES[name]()
    assert case.etfuse_ops == ETFUSE_OPS[name]


@pytest.mark.parametrize("name", NAMES)
def test_cases_run_on_the_python_runtime(name):
    case = CASES[name]()
    _assert_matches(run(case.pte_bytes, case.inputs), case)


def test_cond_cases_take_both_branches():
    """One program; the inputs pick the branch, so the two expectations differ in kind: the then
    branch keeps relu(x + y) and the else branch relu(fc(x))."""
    then, other = CASES["cond_then"](), CASES["cond_else"]()
    assert then.pte_bytes == other.pte_bytes
    assert then.inputs[0].sum() > 0 > other.inputs[0].sum()
    torch.testing.assert_close(then.expected[0], torch.relu(then.inputs[0] + then.inputs[1]))
    assert not torch.equal(other.expected[0], torch.relu(other.inputs[0] + other.inputs[1]))


def read_outputs_as(path: Path, like: torch.Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=like.dtype).reshape(like.shape)


def test_case_files_round_trip(tmp_path):
    """write_case's inputs read back as the tensors they came from (int64 too), and read_outputs
    gives the expected dtypes and shapes, refusing a file of the wrong size."""
    case = CASES["int4_llama_decode"]()
    folder = write_case(case, tmp_path)
    assert (folder / "model.pte").read_bytes() == case.pte_bytes
    for i, t in enumerate(case.inputs):
        assert torch.equal(read_outputs_as(folder / f"input_{i}.bin", t), t)
    for i, t in enumerate(case.expected):
        (folder / f"output_{i}.bin").write_bytes(t.contiguous().numpy().tobytes())
    got = read_outputs(folder, case.expected)
    assert all(torch.equal(g, w) for g, w in zip(got, case.expected))
    (folder / "output_0.bin").write_bytes(b"\0" * 12)
    with pytest.raises(AssertionError, match="output_0.bin: 12 bytes"):
        read_outputs(folder, case.expected)


# ---- the C++ runner --------------------------------------------------------------------------

def run_runner(runner: list[str], case: DeployCase, tmp_path: Path) -> list[torch.Tensor]:
    """The case through the runner once (no warm-up): its outputs, read back like `expected`."""
    folder = write_case(case, tmp_path / case.name)
    out = folder / "out"
    out.mkdir()
    inputs = [a for i in range(len(case.inputs)) for a in ("--input", str(folder / f"input_{i}.bin"))]
    cmd = [*runner, str(folder / "model.pte"), *inputs, "--output-dir", str(out), "--iterations", "1", "--warmup", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (f"{shlex.join(cmd)} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    assert not (out / f"output_{len(case.expected)}.bin").exists(), "more outputs than the program has"
    return read_outputs(out, case.expected)


def check_runner(runner: list[str], name: str, tmp_path: Path):
    case = CASES[name]()
    _assert_matches(run_runner(runner, case, tmp_path), case)


class TestX86Runner:
    @pytest.fixture(scope="module")
    def runner(self) -> list[str]:
        return [str(readme_consumer.app("host"))]

    @pytest.mark.parametrize("name", NAMES)
    def test_runner_matches_eager(self, runner, name, tmp_path):
        check_runner(runner, name, tmp_path)


def _aarch64_runner(cpu: str, *env: str) -> list[str]:
    return ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, *(a for e in env for a in ("-E", e)),
            str(readme_consumer.app("aarch64"))]


class TestAarch64Runner:
    # neoverse-n1: Armv8.2 with dot products; cortex-a53: Armv8.0, the kernels' plain NEON paths
    @pytest.fixture(scope="module", params=["neoverse-n1", "cortex-a53"])
    def runner(self, request) -> list[str]:
        return _aarch64_runner(request.param)

    @pytest.mark.parametrize("name", NAMES)
    def test_runner_matches_eager(self, runner, name, tmp_path):
        check_runner(runner, name, tmp_path)


# ETFUSE_KERNELS_ISA=baseline: the portable GEMM instead of the NEON micro-kernel, on the programs
# whose convs and linears run it (tests/test_gemm_isa.py checks the GEMM itself on both)
@pytest.mark.parametrize("name", ["cnn", "depthwise_separable", "transformer_block"])
def test_aarch64_runner_on_the_portable_kernels_matches_eager(name, tmp_path):
    check_runner(_aarch64_runner("neoverse-n1", "ETFUSE_KERNELS_ISA=baseline"), name, tmp_path)


# ---- the runner's bad input: one line naming it, a non-zero exit -------------------------------

def _runner_error(args: list[str]) -> tuple[int, str]:
    proc = subprocess.run([str(readme_consumer.app("host")), *args], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etfuse_runner: error: "), proc.stderr
    return proc.returncode, lines[0]


def test_runner_bad_input_is_one_line(tmp_path):
    folder = write_case(CASES["cnn"](), tmp_path / "cnn")
    pte = folder / "model.pte"
    assert _runner_error([str(tmp_path / "missing.pte")])[0] == 1
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(pte.read_bytes()[:3000])
    code, line = _runner_error([str(truncated)])
    assert code == 1 and "truncated" in line
    foreign = tmp_path / "foreign.pte"
    foreign.write_bytes(b"\x7fELF" + bytes(4000))
    code, line = _runner_error([str(foreign)])
    assert code == 1 and "not an ExecuTorch program" in line
    short = tmp_path / "short.bin"
    short.write_bytes(bytes(100))
    code, line = _runner_error([str(pte), "--input", str(short)])
    assert code == 1 and "input 0" in line and "100 bytes" in line and "expected 12288" in line, line
    code, line = _runner_error([str(pte), "--bogus"])
    assert code == 2 and "--bogus" in line
