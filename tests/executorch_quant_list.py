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
    replace_patterns(gm, patterns)
    _fuse_quantized_cat(gm)
    if fix_node_meta_val:
        for n in gm.graph.nodes:
            if n.op == "call_function" and "val" not in n.meta:
                args, kwargs = pytree.tree_map_only(fx.Node, lambda x: x.meta["val"], (n.args, n.kwargs))
                n.meta["val"] = n.target(*args, **kwargs)
    _remove_dtype_getattr_nodes(gm)
    gm.graph.lint()
    gm.graph.eliminate_dead_code()
    return gm


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
