"""The runtime kernels' thread pool (kernels/csrc/spin_pool.h), through programs that use it:
results equal at 1 and 2 threads (the ExecuTorch threadpool's count sets the pool's), from two
Python threads running programs at once (one runs its job inline while the other's runs), and in
a forked child (the parent's workers do not exist there); a decode's dynamically quantized linear,
whose columns are cut into 16 chunks a thread (ops/quantized_weight_linear.h), equal at 1 and 2 threads."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from executorch.exir import to_edge

import etfuse
from etfuse.runtime import load_method
from fusion_helpers import op_names

TOL = dict(rtol=1e-4, atol=1e-4)


def _conv_program():
    """conv+bn+relu6 twice, 64 channels on 24x24 (every conv splits its GEMM over the pool), then
    a 1x1 conv to 8 channels: an output small enough that torch copies it on one thread (torch's
    OpenMP hangs in a forked child that uses it after the parent did)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU6(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 8, 1)).eval()
    x = torch.randn(1, 32, 24, 24)
    program = etfuse.fuse(to_edge(torch.export.export(model, (x,)))).to_executorch()
    return model, x, program


def test_same_results_on_one_and_two_threads():
    from executorch.extension.pybindings import portable_lib as pool

    model, x, program = _conv_program()
    method = load_method(program)
    want = model(x)
    default = pool._threadpool_get_thread_count()
    outs = {}
    try:
        for threads in (1, 2, 1, 2):
            pool._unsafe_reset_threadpool(threads)
            for _ in range(3):
                (out,) = method.execute((x,))
                torch.testing.assert_close(out, want, **TOL)
            outs[threads] = out
    finally:
        pool._unsafe_reset_threadpool(default)
    # the chunks of a conv's GEMM are disjoint: the split does not change a single value
    assert torch.equal(outs[1], outs[2])


def _same_on_one_and_two_threads(method, inputs):
    """method's outputs at 1 and at 2 threads (each run twice): equal to the last value."""
    from executorch.extension.pybindings import portable_lib as pool

    default = pool._threadpool_get_thread_count()
    outs = {}
    try:
        for threads in (1, 2, 1, 2):
            pool._unsafe_reset_threadpool(threads)
            outs[threads] = [method.execute(inputs)[0] for _ in range(2)]
    finally:
        pool._unsafe_reset_threadpool(default)
    for runs in outs.values():
        assert all(torch.equal(r, outs[1][0]) for r in runs)
    return outs[2][0]


@pytest.mark.parametrize("rows", [1, 3, 8], ids=lambda r: f"rows{r}")
def test_decode_linear_dq_same_on_one_and_two_threads(rows):
    """An 8da4w linear over 1 and 3 rows (16 chunks a thread) and 8 (Parallel's two), 1000 columns:
    chunks of uneven width, the last thread's short; the columns are disjoint, so not one value moves."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1000)).eval()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    x = torch.randn(rows, 256)
    edge = etfuse.fuse(to_edge(torch.export.export(model, (x,))))
    assert op_names(edge.exported_program().graph_module) == ["etfuse.linear_dq.default"]
    out = _same_on_one_and_two_threads(load_method(edge.to_executorch()), (x,))
    want = model(x)
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def test_programs_run_from_two_threads_at_once():
    model, x, program = _conv_program()
    want = model(x)
    methods = [load_method(program), load_method(program)]
    failures = []

    def loop(method):
        try:
            for _ in range(30):
                (out,) = method.execute((x,))
                torch.testing.assert_close(out, want, **TOL)
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(repr(e))

    threads = [threading.Thread(target=loop, args=(m,)) for m in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _child(program: bytes, x: torch.Tensor, want: torch.Tensor, queue) -> None:
    try:
        (out,) = load_method(program).execute((x,))
        queue.put(bool(torch.allclose(out, want, **TOL)))
    except Exception as e:  # noqa: BLE001
        queue.put(repr(e))


def test_forked_child_runs_programs():
    model, x, program = _conv_program()
    want = model(x)
    load_method(program).execute((x,))  # the parent's pool has started its workers
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(program.buffer, x, want, queue))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    assert queue.get(timeout=5) is True
