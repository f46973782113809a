"""KV-cache writes (backend_ops/cache_ops.py, kernels/csrc/ops/update_cache.cpp,
patterns/cache_rules.py, passes/inplace_updates.py): `index_put(cache, [None, None, pos], values)`
-> `etfuse::update_cache`, run in place (`update_cache_`, no write-back copy) by `to_executorch`
of a fused program."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig

import etfuse
from etfuse.backend_ops import UPDATE_CACHE
from etfuse.runtime import load_method
from fusion_helpers import assert_greedy_decoding_matches_eager, edge_program, example_llama, op_names

TOL = dict(rtol=1e-4, atol=1e-5)

pytestmark = pytest.mark.usefixtures("eager_kernels")


def _cases():
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(1, 4, 10, 6, generator=g)
    yield "decode at dim 2", cache, torch.randn(1, 4, 1, 6, generator=g), torch.tensor([3]), 2
    yield "prefill of 3", cache, torch.randn(1, 4, 3, 6, generator=g), torch.tensor([0, 1, 2]), 2
    yield "broadcast values (llama's [H, L, D])", cache, torch.randn(4, 1, 6, generator=g), torch.tensor([9]), 2
    yield "negative position", cache, torch.randn(1, 4, 1, 6, generator=g), torch.tensor([-1]), 2
    yield "dim 1, [B, S, H, D]", torch.randn(2, 10, 4, 6, generator=g), torch.randn(2, 2, 4, 6, generator=g), torch.tensor([5, 7]), 1
    yield "strided self and values", cache.transpose(1, 3), torch.randn(1, 4, 2, 6, generator=g).transpose(1, 3), torch.tensor([4, 0]), 2
    yield "int8", torch.randint(-9, 9, (3, 5, 2), dtype=torch.int8), torch.randint(-9, 9, (3, 1, 2), dtype=torch.int8), torch.tensor([2]), 1


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_kernel_matches_its_pattern(kernel_check, case):
    _, cache, values, positions, dim = case
    want = UPDATE_CACHE.pattern(cache, values, positions, dim)
    kernel_check.eager(UPDATE_CACHE, (cache, values, positions, dim), want=want)  # the C++ .out
    # the in-place form in torch is its reference kernel (the pattern, copied into self); its C++
    # kernel is the runtime's: test_llama_cache_is_written_in_place_on_the_runtime
    written = cache.clone()
    assert UPDATE_CACHE.aten_inplace(written, values, positions, dim) is written and torch.equal(written, want)
    assert not torch.equal(cache, want)  # the functional forms left self alone


def test_opcheck(opcheck):
    _, cache, values, positions, dim = next(_cases())
    opcheck(UPDATE_CACHE.aten, (cache, values, positions, dim))
    # out and in-place forms: aot_dispatch cannot functionalize `Tensor(a!)` returns of a custom op
    opcheck.out(UPDATE_CACHE.aten_out, (cache, values, positions, dim), torch.empty_like(cache))
    opcheck(UPDATE_CACHE.aten_inplace, (cache.clone(), values, positions, dim), test_utils=opcheck.OUT_TEST_UTILS)


def test_bad_input_is_named():
    cache, values = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 1, 3)
    with pytest.raises(RuntimeError, match=r"etfuse::update_cache.out: position 4 is out of range for dim 2 of size 4"):
        UPDATE_CACHE.aten_out(cache, values, torch.tensor([4]), 2, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::update_cache.out: values \[1, 2, 2, 3\] do not broadcast"):
        UPDATE_CACHE.aten_out(cache, torch.randn(1, 2, 2, 3), torch.tensor([1]), 2, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::update_cache.out: positions must be int64"):
        UPDATE_CACHE.aten_out(cache, values, torch.tensor([1], dtype=torch.int32), 2, out=torch.empty(0))


def _llama():
    return example_llama(kv_cache=True)


def _targets(program) -> list[str]:
    return op_names(program.exported_program().graph_module)


def test_llama_cache_is_written_in_place_on_the_runtime():
    model, eager = _llama(), _llama()
    edge = edge_program(model, (torch.tensor([[1]]), {"input_pos": torch.tensor([0])}))
    fused = etfuse.fuse(edge)
    ops = _targets(fused)
    assert ops.count("etfuse.update_cache.default") == 4 and "aten.index_put.default" not in ops  # 2 layers, k and v
    assert _targets(edge).count("aten.index_put.default") == 4
    # lowered: the writes run in place and no copy_ writes the caches back; the fused program
    # itself stays functional and retraces to index_put
    lowered = fused.to_executorch()
    nodes = [str(n.target) for n in lowered.exported_program().graph_module.graph.nodes]
    assert nodes.count("etfuse.update_cache_.default") == 4 and not [n for n in nodes if "copy_" in n]
    retraced = [str(n.target) for n in fused.exported_program().run_decompositions().graph.nodes]
    assert retraced.count("aten.index_put.default") == 4 and not [n for n in retraced if "etfuse" in n]
    # each step reads what the previous steps wrote in place
    assert_greedy_decoding_matches_eager(load_method(lowered), eager, 8, **TOL)


class CopyThenNorm(torch.nn.Module):
    """A cache write into a copy of the input, returned and read by an RMS norm (fuzz seed 44, graph
    2329, shrunk): written in place, the copy's storage ended at the write and the norm's output
    took it, overwriting the returned copy."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.v = torch.nn.Parameter(torch.randn(2, 4, 4, generator=g))
        self.register_buffer("pos", torch.tensor([1, 0]))
        self.weight = torch.nn.Parameter(torch.rand(4, generator=g) + 0.5)

    def forward(self, x):
        c = x.clone()
        c[:, self.pos] = self.v * 2.0
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5) * self.weight, c


def test_a_write_into_a_copy_stays_functional_on_the_runtime():
    from etfuse.runtime import run

    x = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    model = CopyThenNorm()
    fused = etfuse.fuse(edge_program(model, (x,)))
    assert {"etfuse.update_cache.default", "etfuse.rms_norm.default"} <= set(_targets(fused))
    lowered = fused.to_executorch()
    nodes = [str(n.target) for n in lowered.exported_program().graph_module.graph.nodes]
    assert "etfuse.update_cache.out" in nodes and "etfuse.update_cache_.default" not in nodes
    want = model(x)
    for got, w in zip(run(lowered, (x,)), want):
        torch.testing.assert_close(got, w, **TOL)


def test_config_passes_route_runs_the_functional_write():
    """ExecutorchBackendConfig(passes=...) fuses after executorch inserted the write-backs: the
    `.out` kernel then runs, with the copy back, and decodes as eager does."""
    from etfuse.passes import default_passes

    model, eager = _llama(), _llama()
    edge = edge_program(model, (torch.tensor([[1]]), {"input_pos": torch.tensor([0])}))
    lowered = copy.deepcopy(edge).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    nodes = [str(n.target) for n in lowered.exported_program().graph_module.graph.nodes]
    assert nodes.count("etfuse.update_cache.out") == 4
    assert_greedy_decoding_matches_eager(load_method(lowered), eager, 4, **TOL)
