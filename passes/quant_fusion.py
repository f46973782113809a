"""QuantFusionPass: dequantize -> add [-> relu] -> quantize and dequantize -> embedding into
`quantized_decomposed` ops (rules in patterns/quant_rules.py), int8 and uint8; a drop-in for
executorch's `executorch.exir.passes.quant_fusion_pass`.

The quantized rules of the one rule table, alone: `default_passes()` runs them with every other
rule in one `FusionPass`. Shared dequantize nodes are split per use first, on a copy
(passes/split_dequantize.py); if nothing fuses the result is a plain copy of the caller's module.

Drop-in: the module offers what executorch's does, with the same arguments and meaning, so
switching the import is the only change (tests/test_executorch_quant_fusion.py runs executorch's
own test file that way):

    QuantFusionPass(_fix_node_meta_val=..., node_value_dict=...)   # an ExportPass
    _get_node_value_dict(program)                                  # {placeholder name: weight}
    quant_fusion_and_const_prop_pass(program)                      # fuse, then fold constants

Differences: fused ops are in the backend dialect (`exir_ops.backend...`, same op names); the
pass returns a new graph module instead of editing the caller's (executorch's pass manager
uses the returned one either way), and every node it writes has `meta["val"]`, so
`_fix_node_meta_val` is accepted and not needed.
"""

from __future__ import annotations

from typing import Optional

from executorch.exir.passes.constant_prop_pass import constant_prop_pass
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument

from etfuse.patterns import QUANT_RULES

from .fusion_pass import FusionPass


class QuantFusionPass(FusionPass):
    """Fuses quantized add / add_relu / add.scalar / embedding chains (see patterns/quant_rules.py).

    `node_value_dict` ({placeholder name: tensor}, `_get_node_value_dict(program)`) lets rules
    see weight values a graph module does not hold (a sub-byte embedding's zero points: all zero
    fuses to the op without them, as executorch's pass does). `_fix_node_meta_val` is accepted
    for executorch's signature; etfuse always writes `meta["val"]`.
    """

    def __init__(self, _fix_node_meta_val: bool = False, node_value_dict: Optional[dict] = None,
                 near_misses: bool = False):
        super().__init__(QUANT_RULES, near_misses, node_value_dict=node_value_dict)


def _get_node_value_dict(program: ExportedProgram) -> dict:
    """{placeholder name: tensor} of the program's parameters and buffers (executorch's helper of
    the same name and meaning, kept under its name for drop-in use)."""
    values = {}
    for spec in program.graph_signature.input_specs:
        if (spec.kind in (InputKind.BUFFER, InputKind.PARAMETER) and isinstance(spec.arg, TensorArgument)
                and spec.target in program.state_dict):
            values[spec.arg.name] = program.state_dict[spec.target]
    return values


def quant_fusion_and_const_prop_pass(program: ExportedProgram) -> ExportedProgram:
    """Fuse `program` with `QuantFusionPass` (weights visible to the rules), then fold constants
    (weight packing included) with executorch's `constant_prop_pass`.

    Like executorch's function of the same name, it updates `program` in place and returns it
    (callers of executorch's rely on that). The fused graph is built first and swapped in only
    once it exists: a failing rule leaves `program` as it was.
    """
    result = QuantFusionPass(node_value_dict=_get_node_value_dict(program))(program.graph_module)
    gm = program.graph_module
    for name, child in result.graph_module.named_children():  # control-flow bodies
        setattr(gm, name, child)
    gm.graph = result.graph_module.graph
    gm.recompile()
    return constant_prop_pass(program)
