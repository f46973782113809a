"""The `etfuse` command: demo, fuse a .pt2, and one-line errors with exit code 2."""

import re

import pytest
import torch

from etfuse.passes.cli import main


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
    assert re.search(r"add_relu\s+in forward", out)
    assert re.search(r"add_relu\s+in submodule_0", out)  # inside the torch.cond branch
    error = float(re.search(r"max abs error, ExecuTorch runtime vs eager: (\S+)", out).group(1))
    assert error < 1e-4
    assert re.search(r"runtime latency: stock [\d.]+ ms, fused [\d.]+ ms", out)


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
