"""One test per module of etfuse.passes.compat: each runs executorch 1.5.1's stock path and
asserts that the upstream bug the module works around is still there. When one of these fails,
executorch fixed the bug: delete the module, its pass from the pipeline, and the test."""

import subprocess
import sys
import textwrap

import pytest
import torch
from executorch.exir import to_edge
from torch.export import export

from test_cond_views import CondFlattenRelu6, CondReshapeTwice, X, _execute, _max_error
from test_control_flow import OnnxLoop, TwoIfsAndAScan, _int32, _Loaded, _map_program
from test_symint_prims import EveryBuiltin, _export


def test_while_loop_to_scan_stock_cannot_emit_while_loop():
    ep = export(OnnxLoop(), (_int32(3), _int32(6), torch.tensor(True)))
    with pytest.raises(Exception, match="Unsupported control flow operator"):
        to_edge(ep).to_executorch()


def test_map_to_scan_stock_to_edge_specialises_a_dynamic_map():
    edge = to_edge(_map_program())
    assert [str(k) for k in edge.exported_program().range_constraints] == ["4"]  # n is now 4


def test_symint_to_prims_stock_lowering_rejects_symbolic_builtins():
    # executorch's edge verifier asserts on `torch.sym_max` & co. (a bare AssertionError)
    with pytest.raises(AssertionError) as failed:
        to_edge(_export(EveryBuiltin()))
    assert failed.traceback[-1].path.name == "verifier.py"


def test_cond_outputs_stock_runtime_overwrites_an_if_result():
    run = _Loaded(to_edge(export(TwoIfsAndAScan(), (torch.ones(1), torch.randn(8), torch.randn(3, 8)))))
    for p in (torch.ones(1), -torch.ones(1)):
        a, xs = torch.randn(8), torch.randn(3, 8)
        assert not torch.allclose(run(p, a, xs)[1], TwoIfsAndAScan()(p, a, xs)[1])  # silently wrong


@pytest.mark.parametrize("model", [CondFlattenRelu6, CondReshapeTwice])
def test_cond_views_stock_runtime_misreads_a_view_of_a_cond_result(model):
    stock = to_edge(torch.export.export(model(), (X,)))
    assert _max_error(_execute(stock, X), model()(X)) > 1.0  # silently wrong


def test_typed_pass_errors_stock_pass_manager_hides_the_error_type():
    """In a fresh process (no etfuse pipeline built): executorch wraps an EtfuseError in a bare Exception."""
    code = textwrap.dedent("""
        import torch
        from executorch.exir import to_edge
        from executorch.exir.pass_base import ExportPass
        from etfuse.passes.compat.while_loop_to_scan import LoopLoweringError

        class Fails(ExportPass):
            def call(self, gm):
                raise LoopLoweringError("from the pass")

        class M(torch.nn.Module):
            def forward(self, x):
                return x + 1

        try:
            to_edge(torch.export.export(M(), (torch.randn(2),))).transform([Fails()])
        except Exception as e:
            print(type(e).__name__, type(e.__cause__).__name__)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["Exception", "LoopLoweringError"]
