"""executorch's `QuantFusionPass`, step for step, with etfuse's `replace_patterns` in place of
`subgraph_rewriter.replace_pattern_with_filters` (tests/test_executorch_quant_list.py,
benchmarks/replace_pattern.py).

The pattern list is executorch's own, unchanged (`get_quant_patterns_and_replacements`); the
steps after it are copies of `executorch/exir/passes/quant_fusion_pass.py`'s (module-private
there): fuse dequantize -> cat -> quantize with equal qparams, optionally recompute the new
nodes' `meta["val"]`, replace `getattr(x, "dtype")` by the dtype, lint, drop dead code.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.passes._quant_patterns_and_replacements import get_quant_patterns_and_replacements
from torch.utils import _pytree as pytree

from etfuse.passes import replace_patterns

_Q = exir_ops.edge.quantized_decomposed.quantize_per_tensor.default
_DQ = exir_ops.edge.quantized_decomposed.dequantize_per_tensor.default
_CAT = exir_ops.edge.aten.cat.default


def quant_fusion(gm: fx.GraphModule, node_value_dict=None, fix_node_meta_val: bool = False,
                 patterns=None) -> fx.GraphModule:
    """`QuantFusionPass(_fix_node_meta_val, node_value_dict)(gm)` through etfuse; `patterns`:
    the list, if already built (executorch builds it on every call)."""
    if patterns is None:
        patterns = get_quant_patterns_and_replacements(node_value_dict)
    replace_patterns(gm, patterns, recompile=False)  # `_remove_dtype_getattr_nodes` recompiles
    _fuse_quantized_cat(gm)
    if fix_node_meta_val:
        for n in gm.graph.nodes:
            if n.op == "call_function" and "val" not in n.meta:
                args, kwargs = pytree.tree_map_only(fx.Node, lambda x: x.meta["val"], (n.args, n.kwargs))
                n.meta["val"] = n.target(*args, **kwargs)
    _remove_dtype_getattr_nodes(gm)  # drops dead code, lints, recompiles
    return gm  # (executorch lints and drops dead code once more here: nothing is left to drop)


def _fuse_quantized_cat(gm: fx.GraphModule) -> None:
    """dequantize -> cat -> quantize, all with the same qparams: cat on the quantized inputs."""
    for q in gm.graph.find_nodes(op="call_function", target=_Q):
        cat = q.args[0]
        if cat.op != "call_function" or cat.target != _CAT or not isinstance(cat.args[0], (tuple, list)):
            continue
        inputs = cat.args[0]
        if not all(a.op == "call_function" and a.target == _DQ and list(a.args[1:]) == list(q.args[1:])
                   for a in inputs):
            continue
        for a in inputs:
            cat.replace_input_with(a, a.args[0])
        q.replace_all_uses_with(cat)
        gm.graph.erase_node(q)


def _remove_dtype_getattr_nodes(gm: fx.GraphModule) -> None:
    for n in gm.graph.find_nodes(op="call_function", target=getattr):
        if isinstance(n.args[0], fx.Node) and n.args[1] == "dtype":
            n.replace_all_uses_with(n.args[0].meta["val"].dtype)
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def executorch_quant_fusion(gm: fx.GraphModule, node_value_dict=None, fix_node_meta_val: bool = False) -> fx.GraphModule:
    """executorch's own pass, for comparison."""
    from executorch.exir.passes.quant_fusion_pass import QuantFusionPass

    return QuantFusionPass(_fix_node_meta_val=fix_node_meta_val, node_value_dict=node_value_dict)(gm).graph_module


# --- quantized edge programs, built the way executorch's tests build them ------------------------


def fx_quantized_edge(model: torch.nn.Module, args: tuple, qconfig_mapping=None):
    """`prepare_fx` + `_convert_to_reference_decomposed_fx` (uint8, qnnpack qconfig), exported and
    lowered to edge, as in executorch's test_quant_fusion_pass.py."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.backend_config.executorch import get_executorch_backend_config
    from torch.ao.quantization.quantize_fx import _convert_to_reference_decomposed_fx, prepare_fx

    qconfig_mapping = qconfig_mapping or get_default_qconfig_mapping("qnnpack")
    m = prepare_fx(model.eval(), qconfig_mapping, args, backend_config=get_executorch_backend_config())
    m(*args)
    m = _convert_to_reference_decomposed_fx(m)
    return to_edge(torch.export.export(m, args, strict=True), compile_config=EdgeCompileConfig(_check_ir_validity=False))


def pt2e_quantized_edge(model: torch.nn.Module, args: tuple, dtype=torch.uint8):
    """PT2E with executorch's XNNPACK quantizer, activations per tensor in `dtype` (uint8: the
    dtype executorch's patterns are written for; int8: the quantizer's default), min/max
    observers (fast)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config,
    )
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import QuantizationConfig
    from executorch.exir import EdgeCompileConfig, to_edge
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    info = torch.iinfo(dtype)
    act = QuantizationSpec(dtype=dtype, quant_min=info.min, quant_max=info.max, qscheme=torch.per_tensor_affine,
                           is_dynamic=False, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
    weights = get_symmetric_quantization_config()
    m = torch.export.export(model.eval(), args).module()
    m = prepare_pt2e(m, XNNPACKQuantizer().set_global(QuantizationConfig(act, act, weights.weight, weights.bias)))
    m(*args)
    m = convert_pt2e(m)
    return to_edge(torch.export.export(m, args), compile_config=EdgeCompileConfig(_check_ir_validity=False))
