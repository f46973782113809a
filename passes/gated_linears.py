"""GatedLinearsPass: a gated MLP's two linears over one input become one linear over both weights.

A llama MLP computes `w2(silu(w1(x)) * w3(x))`. After the fusion pass that is

    mul(linear_act(x, w1, b1, activation="silu"), linear_act(x, w3, b3))     (or linear_qw's, linear_dq's)

two GEMMs that read the same x and a third op that combines them. With the program in hand this
pass writes

    linear_act(x, cat([w1, w3]), cat([b1, b3]), activation="swiglu")        (geglu for gelu)

whose kernel runs one GEMM over the 2h features and combines the halves while they are in cache
(backend_ops/gemm_conv_ops.py GATED_ACTIVATIONS): per llama layer one linear and one `mul` fewer.
linear_qw's and linear_dq's weights (int8, or int4 packed per row), scales, zero points and biases
(and linear_dq's weight sums) concatenate the same way. The concatenation runs once, at fuse time
(executorch's constant propagation, asked to fold these `cat`s only): the .pte holds the joined weight instead of the two.

It applies where both linears read the same input, both weights (and biases, scales, zero
points) are constants of the same kind, neither linear has a clamp or a residual, the second has
no activation, and the mul is all that reads either. Like FoldPackedWeightsPass it works on a copy;
given a graph module alone (`ExecutorchBackendConfig(passes=...)`) there are no values and it
changes nothing. Only the top-level graph is visited. It runs after FoldPackedWeightsPass (the
4-bit weights are packed constants by then) and before PrepackWeightsPass (which packs the joined
weight of a multi-row linear for the GEMM's panels).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportedProgramPassResult
from executorch.exir.passes.constant_prop_pass import get_constant_placeholder_dict

from etfuse.backend_ops import LINEAR_ACT, LINEAR_DQ, LINEAR_QW
from etfuse.backend_ops.gemm_conv_ops import GATED_ACTIVATIONS

from .engine import _aten, _schema_args
from .fold_packed_weights import fold_only
from .graph_copy import ValuesPass, editable_copy

_GATED = {inner: gated for gated, inner in GATED_ACTIVATIONS.items()}  # "silu" -> "swiglu"
_MUL = exir_ops.edge.aten.mul.Tensor
_CAT = torch.ops.aten.cat.default  # the ATen overload: the fold below takes these cats and no other
# per op: the arguments concatenated along the output features, and those that must be equal
_JOINED = {LINEAR_ACT.aten: ("weight", "bias"), LINEAR_QW.aten: ("weight", "scales", "zero_points", "bias"),
           LINEAR_DQ.aten: ("weight", "weight_row_sums", "scales", "zero_points", "bias")}
_SAME = {LINEAR_ACT.aten: ("input", "min", "max", "residual"),
         **{op.aten: ("input", "bits", "residual") for op in (LINEAR_QW, LINEAR_DQ)}}


def _named_args(node: fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in (the engine's `_schema_args`)."""
    return dict(zip((a.name for a in node.target._schema.arguments), _schema_args(node)))


def _linear(node) -> Optional[dict]:
    if isinstance(node, fx.Node) and node.op == "call_function" and _aten(node.target) in _JOINED:
        return _named_args(node)
    return None


def _joinable(first: fx.Node, second: fx.Node, mul: fx.Node, constants: dict) -> bool:
    a, b = _linear(first), _linear(second)
    if a is None or b is None or first.target != second.target or set(first.users) != {mul} \
            or set(second.users) != {mul} or first is second:
        return False
    op = _aten(first.target)
    if a["activation"] not in _GATED or b["activation"] != "none" or a.get("residual") is not None:
        return False
    if a.get("min") is not None or a.get("max") is not None:
        return False
    if any(a[name] is not b[name] and a[name] != b[name] for name in _SAME[op]):
        return False
    for name in _JOINED[op]:
        x, y = a[name], b[name]
        if x is None and y is None:
            continue
        if x not in constants or y not in constants:
            return False
        vx, vy = constants[x], constants[y]
        if vx.dtype != vy.dtype or vx.shape[1:] != vy.shape[1:]:
            return False
    return True


def _gated_pairs(graph: fx.Graph, constants: dict) -> list:
    """(mul, the activated linear, the other) for every mul this pass joins."""
    pairs = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target != _MUL or len(node.args) != 2:
            continue
        x, y = node.args
        for first, second in ((x, y), (y, x)):
            if _joinable(first, second, node, constants):
                pairs.append((node, first, second))
                break
    return pairs


class GatedLinearsPass(ValuesPass):
    """mul(linear(x, w1, act), linear(x, w3)) -> linear(x, cat(w1, w3), gated act) (module docstring)."""

    def call(self, ep) -> ExportedProgramPassResult:
        constants = get_constant_placeholder_dict(ep)
        names = {mul.name for mul, _, _ in _gated_pairs(ep.graph, constants)}
        if not names:
            return ExportedProgramPassResult(ep, False)
        new = editable_copy(ep)
        graph = new.graph
        for mul, first, second in _gated_pairs(graph, get_constant_placeholder_dict(new)):
            if mul.name not in names:
                continue
            a, b = _named_args(first), _named_args(second)
            op = _aten(first.target)
            args = dict(a)
            with graph.inserting_before(mul):
                for name in _JOINED[op]:
                    if a[name] is not None:
                        args[name] = _cat(graph, a[name], b[name])
                args["activation"] = _GATED[a["activation"]]
                joined = graph.call_function(first.target, tuple(args.values()))
            joined.meta = dict(mul.meta)
            joined.meta["etfuse"] = {"pass": "GatedLinearsPass"}  # etfuse.fuse verifies the nodes it wrote
            mul.replace_all_uses_with(joined)
            for node in (mul, first, second):
                graph.erase_node(node)
        new.graph_module.recompile()
        new = fold_only(new, lambda target: target is _CAT)
        left = [n.name for n in new.graph.nodes if n.op == "call_function" and n.target is _CAT]
        if left:
            raise RuntimeError(f"GatedLinearsPass: the joined weights were not folded into constants at {left}")
        return ExportedProgramPassResult(new, True)


def _cat(graph: fx.Graph, x: fx.Node, y: fx.Node) -> fx.Node:
    """cat([x, y]) of two constants (at the graph's insert point), to be folded."""
    node = graph.call_function(_CAT, ([x, y],))
    vx, vy = x.meta["val"], y.meta["val"]
    with vx.fake_mode:
        node.meta["val"] = torch.cat([vx, vy])
    return node
