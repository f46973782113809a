"""Fusion with a dynamic sequence length (issue 46; executorch's llama export makes it dynamic by
default): a transformer block (layer norm, causal `scaled_dot_product_attention`, GELU MLP)
exported with `Dim("T")` gets the attention and the linears' epilogues the static export gets,
and the fused program is right at the Dim's bounds and between, in eager, retraced and on the
runtime (patterns/attention_rules.py, patterns/linear_rank_rules.py: symbolic sizes compared
with `constraints.same_shapes`)."""

from __future__ import annotations

import torch
from executorch.exir import to_edge
import etfuse
from etfuse.runtime import run
from deploy_models import TransformerBlock
from fusion_helpers import op_names


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
    # the same fused ops; only the weight packing waits for static rows (PrepackWeightsPass:
    # linear_packed_act at a static length, linear_act at a dynamic one)
    both = {"etfuse.layer_norm.default", "etfuse.sdpa.default", "etfuse.permute_copy.default"}
    assert _etfuse_ops(static) == both | {"etfuse.linear_packed_act.default"}
    assert _etfuse_ops(dynamic) == both | {"etfuse.linear_act.default"}


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
