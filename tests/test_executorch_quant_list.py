"""executorch's own pattern list (`get_quant_patterns_and_replacements`, unchanged) applied with
etfuse's `replace_patterns` gives the same graph as executorch's `QuantFusionPass`, on FX-,
PT2E- and torchao-quantized edge programs (tests/executorch_quant_list.py: the pass's steps)."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir.passes.quant_fusion_pass import _get_node_value_dict
from torch.ao.quantization import float_qparams_weight_only_qconfig, get_default_qconfig_mapping

from executorch_quant_list import executorch_quant_fusion, fx_quantized_edge, pt2e_quantized_edge, quant_fusion


class AddReshapeSliceCat(torch.nn.Module):
    def forward(self, x, y):
        x = x + y
        x = x.reshape(1, x.numel())
        z = torch.cat([x, x], 0)
        w = torch.relu(x + x)
        return x[:, 1:] + y.reshape(1, -1)[:, 1:], z, w


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        a = torch.relu(x + y)
        return a + x, (x + y)[1:]


class Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 12)

    def forward(self, indices):
        return self.emb(indices)


XY = (torch.randn(3, 5), torch.randn(3, 5))
INDICES = (torch.tensor([1, 2, 9, 0]),)
EMBEDDING_QCONFIG = get_default_qconfig_mapping("qnnpack").set_object_type(
    torch.nn.Embedding, float_qparams_weight_only_qconfig)


def torchao_embedding(bits: int, per_group: bool, dtype=None):
    from executorch.exir import EdgeCompileConfig, to_edge
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, MappingType, quantize_

    model = torch.nn.Sequential(torch.nn.Embedding(10, 64), torch.nn.Linear(64, 8))
    if dtype is not None:
        model = model.to(dtype)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"),
                                          granularity=PerGroup(32) if per_group else PerAxis(0),
                                          mapping_type=MappingType.ASYMMETRIC if bits == 4 else MappingType.SYMMETRIC),
              lambda m, fqn: isinstance(m, torch.nn.Embedding))
    ep = torch.export.export(model, (torch.tensor([1, 2, 3]),), strict=True)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))


PROGRAMS = {
    "fx_add_reshape_slice_cat": (lambda: fx_quantized_edge(AddReshapeSliceCat(), XY), ["quantized_decomposed_add_default", "aten_cat_default([quantized_decomposed_quantize_per_tensor"]),
    "fx_embedding_byte": (lambda: fx_quantized_edge(Embedding(), INDICES, EMBEDDING_QCONFIG), ["quantized_decomposed_embedding_byte_default"]),
    "pt2e_uint8_add_relu": (lambda: pt2e_quantized_edge(AddRelu(), XY), ["quantized_decomposed_add_relu_default", "quantized_decomposed_add_default"]),
    "torchao_2bit_per_group": (lambda: torchao_embedding(2, True), ["quantized_decomposed_embedding_2bit_default"]),
    "torchao_4bit_per_axis_fp16": (lambda: torchao_embedding(4, False, torch.float16), ["quantized_decomposed_embedding_4bit_dtype"]),
    "torchao_8bit_per_group": (lambda: torchao_embedding(8, True), ["quantized_decomposed_embedding_byte_default"]),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_same_graph_as_executorchs_quant_fusion_pass(name):
    build, fused_ops = PROGRAMS[name]  # fused_ops: text the fused graph's code contains
    edge = build()
    gm = edge.exported_program().graph_module
    node_value_dict = _get_node_value_dict(edge.exported_program())
    theirs, ours = copy.deepcopy(gm), copy.deepcopy(gm)
    executorch_quant_fusion(theirs, node_value_dict, fix_node_meta_val=True)
    quant_fusion(ours, node_value_dict, fix_node_meta_val=True)
    assert ours.code == theirs.code
    for text in fused_ops:  # the list did fuse something here
        assert text in ours.code, text
    for a, b in zip(ours.graph.nodes, theirs.graph.nodes):
        assert a.meta.get("val") is not None or b.meta.get("val") is None, a.name
