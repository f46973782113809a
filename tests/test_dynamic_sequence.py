"""Fusion with a dynamic sequence length (issue 46; executorch's llama export makes it dynamic by
default): the same model exported with a static length and with `Dim("T")` gets the same etfuse
ops, and the dynamic program is right at the Dim's bounds and between, in eager, retraced and on
the runtime. Two models: a transformer block (layer norm, causal `scaled_dot_product_attention`,
GELU MLP; patterns/attention_rules.py, linear_rank_rules.py) and executorch's example llama with
a KV cache, exported as its llama export does (RMS norm, rope, SwiGLU, attention over the cache,
the cache written in place; patterns/rope_rules.py, cache_rules.py). Symbolic sizes are compared
with `constraints.same_shapes` / `broadcasts`; weights are packed at symbolic rows
(passes/prepack_weights.py)."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge

import etfuse
from etfuse.runtime import load_method, run
from deploy_models import TransformerBlock
from fusion_helpers import example_llama, llama_edge_program, op_names


def _etfuse_ops(fused) -> set[str]:
    return {n for n in op_names(fused.exported_program().graph_module) if n.startswith("etfuse.")}


def _block():
    torch.manual_seed(0)
    return TransformerBlock().eval()  # dim 64, 4 heads: layer norms, causal SDPA, GELU MLP


def test_a_dynamic_sequence_length_fuses_attention_and_the_epilogues(runtime_kernels):
    model, x = _block(), torch.randn(1, 16, 64)
    static = etfuse.fuse(to_edge(torch.export.export(model, (x,))))
    T = torch.export.Dim("T", min=2, max=64)
    dynamic = etfuse.fuse(etfuse.to_edge(torch.export.export(model, (x,), dynamic_shapes=({1: T},))))
    names = set(op_names(dynamic.exported_program().graph_module))
    assert not names & {"aten.bmm.default", "aten._softmax.default", "aten.gelu.default", "aten.addmm.default",
                        "aten.mm.default"}, names
    both = {"etfuse.layer_norm.default", "etfuse.sdpa.default", "etfuse.permute_copy.default",
            "etfuse.linear_packed_act.default"}
    assert _etfuse_ops(static) == both
    assert _etfuse_ops(dynamic) == both


def test_the_dynamic_program_is_right_at_every_length(runtime_kernels):
    model = _block()
    T = torch.export.Dim("T", min=2, max=64)
    fused = etfuse.fuse(etfuse.to_edge(torch.export.export(model, (torch.randn(1, 16, 64),),
                                                           dynamic_shapes=({1: T},))))
    retraced = fused.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced.graph_module) if n.startswith("etfuse.")]
    program = fused.to_executorch()
    for t in (2, 7, 24, 64):
        x = torch.randn(1, t, 64)
        want = model(x)
        torch.testing.assert_close(fused.exported_program().module()(x), want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(retraced.module()(x), want, atol=1e-4, rtol=1e-4)
        (got,) = run(program, (x,))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m, t=t: f"T={t}: {m}")


# --- executorch's example llama, with a KV cache and without ----------------------------------

MAX_SEQ_LEN = 32  # example_llama's
LLAMA_TOL = dict(rtol=1e-4, atol=1e-4)


def _llama(kv_cache: bool = True):
    return example_llama(kv_cache=kv_cache, dynamic_shape=True)


def _fused_llama(model, dynamic: bool, kv_cache: bool = True):
    return etfuse.fuse(llama_edge_program(model, dynamic, kv_cache))


@pytest.fixture(scope="module")
def dynamic_llama():
    return _fused_llama(_llama(), dynamic=True)


def test_a_dynamic_length_llama_fuses_as_a_static_one(dynamic_llama, runtime_kernels):
    static = _fused_llama(_llama(), dynamic=False)
    # RMS norm, rope, the SwiGLU (w1 and w3 as one gated linear) and the other linears on packed
    # weights, the cache writes, attention over the cache; the output linear reads the last
    # token only (one row: unpacked)
    want = {"etfuse.rms_norm.default", "etfuse.rope.default", "etfuse.linear_packed_act.default",
            "etfuse.linear_act.default", "etfuse.update_cache.default", "etfuse.sdpa.default",
            "etfuse.permute_copy.default"}
    assert _etfuse_ops(static) == want
    assert _etfuse_ops(dynamic_llama) == want
    names = op_names(dynamic_llama.exported_program().graph_module)
    assert names.count("etfuse.rope.default") == 4 and names.count("etfuse.update_cache.default") == 4, names
    assert not set(names) & {"aten.index_put.default", "aten.bmm.default", "aten._softmax.default", "aten.mm.default",
                             "aten.rsqrt.default", "aten.cat.default", "aten.sigmoid.default"}, names
    gated = [n for n in dynamic_llama.exported_program().graph.nodes if "swiglu" in n.args]
    assert len(gated) == 2, "one gated linear a layer"


def test_the_dynamic_llama_is_right_at_every_length(dynamic_llama, runtime_kernels):
    """A prompt of T tokens at position 0, then one decoding step at T reading the cache the
    prompt wrote (in place on the runtime), for T at 1 (the Dim's range starts at 0, a prompt
    without tokens), two lengths between and the Dim's max. Each of the four programs keeps its
    cache from step to step; what a longer earlier prompt left past T is masked."""
    eager = _llama()
    fused = dynamic_llama.exported_program().module()
    # an edge program of this llama does not retrace even unfused (torch 2.13: the retrace
    # leaves unbacked symbols of the data-dependent start position unbound,
    # PendingUnbackedSymbolNotFound); torch's soft mode warns instead, and the numbers below check
    # the retrace
    with torch.fx.experimental._config.patch(soft_pending_unbacked_not_found_error=True):
        retraced_program = dynamic_llama.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced_program.graph_module) if n.startswith("etfuse.")]
    retraced = retraced_program.module()
    lowered = dynamic_llama.to_executorch()
    plan = [str(n.target) for n in lowered.exported_program().graph.nodes]
    assert plan.count("etfuse.update_cache_.default") == 4 and not [n for n in plan if "copy_" in n]
    method = load_method(lowered)
    g = torch.Generator().manual_seed(0)
    for t in (1, 7, 19, MAX_SEQ_LEN - 1):
        prompt = torch.randint(1, 97, (1, t), generator=g)
        # a step after the longest prompt would start past the program's range (it asserts a
        # start position <= 30)
        steps = [(prompt, 0)] + ([(prompt[:, -1:], t)] if t < MAX_SEQ_LEN - 1 else [])
        for tokens, pos in steps:
            args = (tokens, {"input_pos": torch.tensor([pos])})
            want = eager(*args)
            for name, got in (("fused", fused(*args)), ("retraced", retraced(*args)),
                              ("runtime", method.execute((tokens, args[1]["input_pos"]))[0])):
                torch.testing.assert_close(got, want, **LLAMA_TOL,
                                           msg=lambda m, name=name, t=t, pos=pos: f"{name}, T={t} at {pos}: {m}")


def test_a_dynamic_length_llama_without_a_cache_fuses_as_a_static_one_and_is_right(runtime_kernels):
    """No KV cache: attention with the causal mask sliced to [T, T], over all T tokens."""
    model = _llama(kv_cache=False)
    static, dynamic = (_fused_llama(model, dynamic, kv_cache=False) for dynamic in (False, True))
    want = {"etfuse.rms_norm.default", "etfuse.rope.default", "etfuse.linear_packed_act.default",
            "etfuse.linear_act.default", "etfuse.sdpa.default", "etfuse.permute_copy.default"}
    assert _etfuse_ops(static) == want
    assert _etfuse_ops(dynamic) == want
    retraced = dynamic.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced.graph_module) if n.startswith("etfuse.")]
    program = dynamic.to_executorch()
    g = torch.Generator().manual_seed(0)
    for t in (1, 7, 19, MAX_SEQ_LEN - 1):
        tokens = torch.randint(1, 97, (1, t), generator=g)
        want = model(tokens)
        for name, got in (("fused", dynamic.exported_program().module()(tokens)),
                          ("retraced", retraced.module()(tokens)), ("runtime", run(program, (tokens,))[0])):
            torch.testing.assert_close(got, want, **LLAMA_TOL, msg=lambda m, name=name, t=t: f"{name}, T={t}: {m}")
