"""FoldPackedWeightsPass: what the embedding fusions leave to be done with the weights' values.

The sub-byte embedding rules (patterns/embedding_rules.py) write
`quant_fusion._pack_embedding_weight(w, bits) -> embedding_{4,2}bit(packed, ...)`, the 4-bit
linear rules (patterns/weight_only_rules.py) `etfuse::pack_int4(w) -> linear_qw(...)`, the
dynamically quantized ones (patterns/dynamic_quant_rules.py) `weight_row_sums(w, s, zp)` beside it: a graph
module has no weight values, so the packing is an op. With the program in hand this pass

* runs every pack op whose weight is a constant (parameter, buffer, lifted constant) once and
  puts the packed table in the program as a constant, in place of the op (executorch's
  `constant_prop_pass`, asked to fold the pack ops and nothing else); the unpacked weight goes
  when nothing else reads it;
* drops zero points that are constants and all 0 from the embedding ops, linear_qw and linear_dq (None: symmetric
  quantization; `(q - 0) * s` is `q * s`, bit for bit).

It works on a copy: the caller's program, graph module, state dict and constants stay as they
were. `etfuse.fuse` and `edge.transform(default_passes())` run it after the fusion pass. Given a
graph module alone (`ExecutorchBackendConfig(passes=...)` hands passes only that) there are no
values: it returns a copy, the pack ops stay in the program and run on the runtime at every call
(`quant_fusion::_pack_embedding_weight.out`, kernels/csrc/ops/pack_embedding_weight.cpp).
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from executorch.exir.pass_base import ExportedProgramPassResult
from executorch.exir.passes.constant_prop_pass import constant_prop_pass, get_constant_placeholder_dict

from etfuse.backend_ops import (EMBEDDING_OPS, LINEAR_DQ, LINEAR_QW, PACK_EMBEDDING_WEIGHT, PACK_INT4,
                                WEIGHT_ROW_SUMS)

from .engine import _aten
from .graph_copy import editable_copy, program_with, ValuesPass


_PACKS = {PACK_EMBEDDING_WEIGHT.aten, PACK_INT4.aten, WEIGHT_ROW_SUMS.aten}


def _is_pack(target) -> bool:
    return _aten(target) in _PACKS


# the ops whose zero points go when they are all 0: op -> the zero points' argument index
_ZERO_POINTS = {**{op.aten: 2 for op in EMBEDDING_OPS}, LINEAR_QW.aten: 3, LINEAR_DQ.aten: 4}


class FoldPackedWeightsPass(ValuesPass):
    """Pack ops on constant weights -> packed constants; all-zero constant zero points -> None."""

    def call(self, ep) -> ExportedProgramPassResult:
        constants = get_constant_placeholder_dict(ep)
        packs = [n for n in ep.graph.nodes if n.op == "call_function" and _is_pack(n.target) and n.args[0] in constants]
        if not packs and not _zero_zero_points(ep, constants):
            return ExportedProgramPassResult(ep, False)
        new = editable_copy(ep)
        # packs first: weight_row_sums reads the zero points that are dropped below
        if packs:
            new = fold_only(new, _is_pack)
        zero_zps = _zero_zero_points(new, get_constant_placeholder_dict(new))
        if zero_zps:
            dropped = set()
            for n in zero_zps:
                i = _ZERO_POINTS[_aten(n.target)]
                dropped.add(n.args[i])
                n.args = (*n.args[:i], None, *n.args[i + 1:])
            new = without_unused_constants(new, dropped)
        return ExportedProgramPassResult(new, True)


def _zero_zero_points(ep, constants: dict) -> list:
    """The ops of `ep` whose zero points are constants and all 0."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and _aten(n.target) in _ZERO_POINTS
            and _all_zero(_zero_points(n), constants)]


def fold_only(ep, is_folded):
    """`ep` (owned by the caller) with every op for which `is_folded(target)` holds and whose inputs
    are constants run once and replaced by its result as a constant (executorch's
    `constant_prop_pass`, every other op skipped: the rest of the program stays as it is)."""
    skip = {n.target for n in ep.graph.nodes if n.op == "call_function" and not is_folded(n.target)}
    # executorch warns on the root logger that it does not fold inside control flow: the ops
    # folded here are top-level ones, so the warning says nothing to the caller
    quiet = _Quiet("does not constant propagate in control flow")
    logging.getLogger().addFilter(quiet)
    try:
        return constant_prop_pass(ep, custom_skip_targets=skip)
    finally:
        logging.getLogger().removeFilter(quiet)


class _Quiet(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def without_unused_constants(ep, candidates: set):
    """`ep` (owned by this pass) without the constant placeholders among `candidates` nothing reads."""
    sig = ep.graph_signature
    by_input = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    erased = set()
    for node in candidates:
        if node.users or node.name not in by_input:
            continue
        target = by_input[node.name]
        erased.add(node.name)
        ep.graph.erase_node(node)
        ep.state_dict.pop(target, None)
        ep.constants.pop(target, None)
    ep.graph_module.recompile()
    sig.input_specs = [s for s in sig.input_specs if s.arg.name not in erased]  # the pass's own copy
    return program_with(ep, ep.graph_module, sig, ep.state_dict, ep.constants)


def _zero_points(node: fx.Node):
    i = _ZERO_POINTS[_aten(node.target)]
    return node.args[i] if len(node.args) > i else None


def _all_zero(arg, constants: dict) -> bool:
    value = constants.get(arg) if isinstance(arg, fx.Node) else None
    return isinstance(value, torch.Tensor) and bool((value == 0).all())
