"""The ViT the transformer benchmark times (benchmarks/transformers.py, `vit_b16_96`), at a small
size: every layer norm, linear (the MLP's GELU as the epilogue) and attention of its encoder
blocks is one etfuse op; eager, retrace and runtime equal to eager."""

from __future__ import annotations

import collections

import torch

import etfuse
from etfuse.passes import FusionPass, default_passes
from fusion_helpers import assert_fused_matches_eager, benchmark_module, edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-4)


def _benchmark_vit():
    return benchmark_module("transformers").VisionTransformer  # the model the benchmark times


def test_small_vit_encoder_is_fused_op_for_op():
    torch.manual_seed(0)
    depth = 2
    model = _benchmark_vit()(image=32, dim=32, depth=depth, heads=4, hidden=64, classes=10).eval()
    args = (torch.randn(1, 3, 32, 32),)
    passes = default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    ops = collections.Counter(op_names(out.exported_program().graph_module))
    assert ops["etfuse.layer_norm.default"] == 2 * depth + 1
    # qkv, proj, fc1 + GELU, fc2 on 17 tokens: weights packed at fuse time; the head on one row is not
    assert ops["etfuse.linear_packed_act.default"] == 4 * depth and ops["etfuse.linear_act.default"] == 1
    assert ops["etfuse.sdpa.default"] == depth
    for stock in ("aten.native_layer_norm.default", "aten.gelu.default", "aten.addmm.default", "aten.mm.default",
                  "aten.bmm.default", "aten._softmax.default"):
        assert ops[stock] == 0, stock
    fusion = next(p for p in passes if type(p) is FusionPass)
    rules = collections.Counter(f.rule for f in fusion.report.fused)
    assert rules["linear_nd_gelu"] == depth and rules["sdpa_closed"] == depth and rules["layer_norm"] == 2 * depth + 1
    gelu = [n for n in out.exported_program().graph.nodes if "linear_packed_act" in str(n.target) and "gelu" in n.args[6:]]
    assert len(gelu) == depth
    assert_fused_matches_eager(model, args, out, **TOL)
