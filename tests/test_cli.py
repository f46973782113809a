"""The `etfuse` command: demo, fuse a .pt2, and one-line errors with exit code 2."""

import re
import time

import pytest
import torch

from etfuse.cli import main


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, y):
        return torch.relu(self.fc(x)) + torch.relu(x + y)


def test_demo_fuses_runs_and_matches_eager(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"linear_relu\s+in forward", out)
    assert re.search(r"linear_residual_relu\s+in forward", out)  # relu(fc2(h) + x): one linear_act
    assert re.search(r"add_relu\s+in submodule_0", out)  # inside the torch.cond branch
    error = float(re.search(r"max abs error, ExecuTorch runtime vs eager: (\S+)", out).group(1))
    assert error < 1e-4
    assert re.search(r"runtime latency: stock [\d.]+ ms, fused [\d.]+ ms", out)


DEMO_THEN_SAY_WHAT_LOADED = """
import sys
from etfuse.cli import main
rc = main(["demo"])
import etfuse.kernels
print("EAGER LIBRARY", etfuse.kernels.info().eager_library)
sys.exit(rc)
"""


def test_demo_is_quiet_and_loads_only_the_runtime_library(tmp_path):
    """A first run prints etfuse's lines only (no torchao load failures, no torch override warning,
    no runtime threadpool start-up lines, no warnings from tracing the rules into an empty pattern
    cache), and needs no torch-eager kernel library."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ETFUSE_PATTERN_CACHE=str(tmp_path / "patterns"))
    proc = subprocess.run([sys.executable, "-c", DEMO_THEN_SAY_WHAT_LOADED], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    assert "EAGER LIBRARY None" in proc.stdout


def test_fuse_writes_pte_and_report(tmp_path, capsys):
    args = (torch.randn(4, 16), torch.randn(4, 16))
    model = tmp_path / "net.pt2"
    net = SmallNet()
    torch.export.save(torch.export.export(net, args), model)
    pte, report = tmp_path / "net.pte", tmp_path / "report.md"
    assert main(["fuse", str(model), "-o", str(pte), "--report", str(report)]) == 0
    from etfuse.runtime import run

    (out,) = run(pte, args)
    torch.testing.assert_close(out, net(*args), rtol=1e-5, atol=1e-5)
    text = report.read_text()
    assert "| linear_relu | forward |" in text and "| add_relu | forward |" in text
    assert "| `etfuse.add_relu.default` | 0 | 1 |" in text


def test_fuse_with_shapes(tmp_path):
    model = tmp_path / "net.pt2"
    ep = torch.export.export(SmallNet(), (torch.randn(4, 16), torch.randn(4, 16)))
    torch.export.save(ep, model)
    assert main(["fuse", str(model), "-o", str(tmp_path / "o.pte"), "--shape", "4,16", "--shape", "4x16"]) == 0


@pytest.mark.parametrize("setup, message", [
    (lambda d: d / "missing.pt2", r"missing.pt2: no such file"),
    (lambda d: (d / "text.pt2").write_text("hello") and d / "text.pt2", r"not a torch.export.save file"),
])
def test_bad_files_are_one_line_and_exit_2(tmp_path, capsys, setup, message):
    path = setup(tmp_path)
    assert main(["fuse", str(path), "-o", str(tmp_path / "o.pte")]) == 2
    err = capsys.readouterr().err
    assert re.match(r"etfuse: error: .*" + message, err) and err.count("\n") == 1


def test_zip_that_is_not_an_exported_program(tmp_path, capsys):
    path = tmp_path / "weights.pt2"
    torch.save({"w": torch.zeros(2)}, path)  # a zip file, but not an ExportedProgram
    assert main(["fuse", str(path), "-o", str(tmp_path / "o.pte")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("etfuse: error: ") and "ExportedProgram" in err and err.count("\n") == 1


# Kept alive for the whole session: ops of a collected Library vanish from the dispatcher.
_LIB = torch.library.Library("etfuse_cli_test", "DEF")
_LIB.define("no_out_variant(Tensor x) -> Tensor")
_LIB.impl("no_out_variant", lambda x: x.clone(), "CompositeExplicitAutograd")
torch.library.register_fake("etfuse_cli_test::no_out_variant", lambda x: torch.empty_like(x), lib=_LIB)


def test_unsupported_op_is_one_line(tmp_path, capsys):

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.etfuse_cli_test.no_out_variant(x)

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(M(), (torch.randn(3),)), path)
    assert main(["fuse", str(path), "-o", str(tmp_path / "o.pte")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"etfuse: error: {path}: cannot be lowered and fused:") and err.count("\n") == 1
    assert not (tmp_path / "o.pte").exists()


# --- issue 10: nothing lost, nothing crashes -------------------------------------------------
# Run as users do (`python -m etfuse ...` in a subprocess): exit code 2, one line on stderr, no
# traceback, the input byte-for-byte unchanged and nothing half-written.

import hashlib
import os
import subprocess
import sys

from etfuse.compare import lower_and_compare


class Relu2(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    torch.export.save(torch.export.export(SmallNet(), (torch.randn(4, 16), torch.randn(4, 16))), d / "two.pt2")
    dims = {0: torch.export.Dim("a", min=2), 1: torch.export.Dim("b"), 2: torch.export.Dim("c")}
    torch.export.save(torch.export.export(Relu2(), (torch.randn(2, 3, 4),), dynamic_shapes=(dims,)), d / "dyn3.pt2")
    return d


def _etfuse(cwd, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "etfuse", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _refused(proc, message):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, nothing else
    assert re.match(r"etfuse: error: .*" + message, proc.stderr), proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["two.pt2", "-o", "two.pt2"], r"-o two.pt2: is the input model; refusing to overwrite it"),
    (["two.pt2", "-o", "./sub/../two.pt2"], r"is the input model"),
    (["two.pt2", "-o", "link.pt2"], r"-o link.pt2: is the input model"),
    (["two.pt2", "-o", "out.pte", "--report", "two.pt2"], r"--report two.pt2: is the input model"),
    (["two.pt2", "-o", "out.pte", "--report", "out.pte"], r"--report out.pte: is the same file as -o"),
])
def test_output_equal_to_the_input_is_refused(models, tmp_path, args, message):
    import shutil

    shutil.copy(models / "two.pt2", tmp_path / "two.pt2")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "two.pt2", tmp_path / "link.pt2")
    before = _digest(tmp_path / "two.pt2")
    _refused(_etfuse(tmp_path, "fuse", *args), message)
    assert _digest(tmp_path / "two.pt2") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pt2", "sub", "two.pt2"]


def _read_only_folder(tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits: a read-only file system instead
        return "/sys"
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return str(d)


@pytest.mark.parametrize("case", ["missing folder", "read-only folder", "output is a folder",
                                  "report in a missing folder", "report in a read-only folder"])
def test_unwritable_outputs_are_refused_before_any_work(models, tmp_path, case):
    ro = _read_only_folder(tmp_path)
    args, message = {
        "missing folder": (["-o", "nowhere/m.pte"], r"-o nowhere/m.pte: folder .*nowhere does not exist"),
        "read-only folder": (["-o", f"{ro}/m.pte"], r"cannot write in folder"),
        "output is a folder": (["-o", str(tmp_path)], r"is a folder; name the file to write"),
        "report in a missing folder": (["-o", "m.pte", "--report", "nowhere/r.md"], r"--report nowhere/r.md: folder"),
        "report in a read-only folder": (["-o", "m.pte", "--report", f"{ro}/r.md"], r"--report .*cannot write in folder"),
    }[case]
    before = _digest(models / "two.pt2")
    proc = _etfuse(tmp_path, "fuse", str(models / "two.pt2"), *args, timeout=60)
    _refused(proc, message)
    assert not (tmp_path / "m.pte").exists()  # with a bad --report, no .pte either
    assert [p for p in tmp_path.iterdir() if p.name != "ro"] == []
    assert _digest(models / "two.pt2") == before


@pytest.mark.parametrize("model, shapes, message", [
    ("dyn3.pt2", ["100000,100000,100000"], r"the inputs alone need 3\.\d+ PiB; this machine has"),
    ("two.pt2", ["4,16,1", "4,16"], r"--shape 4,16,1 for input 0 \(x\): rank 3, the program expects rank 2 \(float32"),
    ("two.pt2", ["4,16"], r"1 --shape given, the program takes 2 inputs \(x, y\): give one --shape per input"),
    ("two.pt2", ["-4,16", "4,16"], r"--shape -4,16: sizes must be positive integers, got -4"),
    ("two.pt2", ["=-4,16", "4,16"], r"--shape -4,16: sizes must be positive integers, got -4"),
    ("two.pt2", ["4,16", "4,0"], r"--shape 4,0: sizes must be positive integers, got 0"),
    ("two.pt2", ["4,a", "4,16"], r"--shape '4,a': expected sizes like 1,3,224,224"),
    ("two.pt2", ["8,16", "8,16"], r"--shape 8,16 for input 0 \(x\): dim 0 is static \(4\) in this program; "
                                  r"export it with a torch.export.Dim for dim 0"),
    ("dyn3.pt2", ["1,3,4"], r"--shape 1,3,4 for input 0 \(x\): dim 0 must be in 2\.\."),
])
def test_bad_shapes_are_one_line(models, tmp_path, model, shapes, message):
    args = []
    for s in shapes:
        args += [f"--shape{s}"] if s.startswith("=") else ["--shape", s]
    proc = _etfuse(tmp_path, "fuse", str(models / model), "-o", "m.pte", *args, timeout=60)
    _refused(proc, message)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_one_line(models, tmp_path):
    proc = _etfuse(tmp_path, "fuse", str(models / "two.pt2"), "-o", "m.pte", "--bench", "-3", timeout=60)
    _refused(proc, r"argument --bench: must be 0 or more, got -3")


def test_fuse_times_nothing_unless_asked_and_timing_is_bounded(models, tmp_path, capsys):
    assert main(["fuse", str(models / "two.pt2"), "-o", str(tmp_path / "a.pte")]) == 0
    out = capsys.readouterr()
    assert "latency" not in out.out and "stock" not in out.out
    assert out.err == ""  # stderr is not a terminal: no progress lines
    assert len(out.out.splitlines()) <= 4  # short; details go to --report
    t0 = time.perf_counter()
    assert main(["fuse", str(models / "two.pt2"), "-o", str(tmp_path / "b.pte"), "--compare",
                 "--bench", "100000000", "--bench-seconds", "1", "--progress"]) == 0
    assert time.perf_counter() - t0 < 120
    out = capsys.readouterr()
    runs = int(re.search(r"runtime latency: stock [\d.]+ ms, fused [\d.]+ ms \([\d.]+x, median of (\d+) runs\)", out.out).group(1))
    assert 1 <= runs < 100000000
    assert re.search(r"max abs error, ExecuTorch runtime vs eager: \S+ \(stock program: \S+\)", out.out)
    for stage in ("loading", "preparing the fusion rules", "lowering to the edge dialect", "fusion", "building the .pte", "runtime check", "timing"):
        assert re.search(rf"etfuse: {stage}.*: [\d.]+ s\n", out.err), (stage, out.err)


def test_outputs_are_replaced_atomically(models, tmp_path, capsys):
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"old")
    os.chmod(pte, 0o640)
    assert main(["fuse", str(models / "two.pt2"), "-o", str(pte), "--report", str(tmp_path / "r.md")]) == 0
    assert pte.read_bytes()[4:8] == b"ET12" and (tmp_path / "r.md").read_text().startswith("# etfuse report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte", "r.md"]  # no temporaries left


def test_build_kernels_prints_the_cache_folder(capsys):
    import etfuse.kernels

    assert main(["build-kernels"]) == 0
    out = capsys.readouterr().out
    folder = re.search(r"etfuse kernels (?:built|found in the cache): (\S+)", out).group(1)
    assert os.path.isdir(folder) and os.path.samefile(folder, etfuse.kernels.load().cache_dir)


class TwoConds(torch.nn.Module):
    def forward(self, x):
        a = torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))
        b = torch.cond(x.mean() > 10, lambda x: x + 3, lambda x: x * 5, (x,))
        return a + b


class CondFlattenRelu6(torch.nn.Module):
    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))
        return torch.nn.functional.relu6(y.flatten(1))


@pytest.mark.parametrize("model", [TwoConds, CondFlattenRelu6])
def test_stock_baseline_and_fused_program_compute_the_right_thing(model):
    """The stock program that --compare times must compute what eager does (executorch 1.5.1
    alone gets both models wrong), and so must the fused one."""
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 3 - 2
    result = lower_and_compare(torch.export.export(model(), (x,)), (x,), compare=True, runs=0)
    assert result.max_abs_error < 1e-5 and result.stock_max_abs_error < 1e-5
    assert result.latency_fused_ms is None and result.latency_unfused_ms is None


def test_fuse_with_profile_writes_an_html_report_and_its_chart(models, tmp_path):
    proc = _etfuse(tmp_path, "fuse", str(models / "two.pt2"), "-o", "two.pte", "--report", "report.html",
                   "--profile", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) < 30
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and "linear_relu" in html  # the chart inlined, the fusions listed
    assert (tmp_path / "report.png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.png", "report.svg", "two.pte"]


def test_profile_without_report_is_refused(models, tmp_path):
    _refused(_etfuse(tmp_path, "fuse", str(models / "two.pt2"), "-o", "two.pte", "--profile"), "--profile: needs --report")


def test_pt2e_int8_program_fuses_from_the_command_line(tmp_path):
    """A PT2E-quantized program (quantized_decomposed ops, which only torch.ao's import defines)
    loads in a fresh process, fuses into the int8 ops and matches eager on the runtime."""
    from fusion_helpers import pt2e_int8
    from test_quantized_gemm import SmallQuantNet

    torch.manual_seed(0)
    torch.export.save(pt2e_int8(SmallQuantNet().eval(), (torch.randn(1, 3, 12, 12),)), tmp_path / "q.pt2")
    proc = _etfuse(tmp_path, "fuse", "q.pt2", "-o", "q.pte", "--report", "r.md")
    assert proc.returncode == 0, proc.stderr
    assert "max abs error, ExecuTorch runtime vs eager: 0 " in proc.stdout or \
        "max abs error, ExecuTorch runtime vs eager: 0\n" in proc.stdout, proc.stdout
    report = (tmp_path / "r.md").read_text()
    assert report.startswith("# etfuse report: q.pt2\n")
    assert "quantized_conv2d_requant_hardtanh" in report and "quantized_linear" in report
