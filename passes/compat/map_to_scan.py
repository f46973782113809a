"""MapToScanPass: `map` over a dynamic dimension -> `scan`, so the dimension stays dynamic.

Upstream (executorch 1.5.1): `to_edge` retraces `map` by unstacking its input, which silently
specialises a dynamic mapped dimension to the example size (the program bakes that size into
every value that depends on it and refuses larger inputs). `scan` is retraced from its body's
placeholders and stays dynamic. `etfuse.to_edge` applies this pass before lowering and checks
that no `Dim` was specialised (`refuse_specialised`, `SpecialisedShapeError`).
Delete this module when executorch's `to_edge` keeps `map` dynamic (tests/test_compat.py).
"""

from __future__ import annotations

__all__ = ["MapToScanPass", "SpecialisedShapeError", "refuse_specialised"]

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from etfuse.errors import EtfuseError

from ..graph_copy import copy_graph_module, has_hop

aten = torch.ops.aten
edge = exir_ops.edge.aten
_CLONE = exir_ops.edge.dim_order_ops._clone_dim_order.default  # edge graphs are in dim-order mode
_FULL_KWARGS = {"dtype": torch.float32, "layout": torch.strided, "device": torch.device("cpu"), "pin_memory": False}


class _MapOutputs:
    """What `call_map` returns: the scan's stacked outputs, read back by `getitem` index."""

    def __init__(self, items):
        self.items = items


def _map_step_module(f: fx.GraphModule, n_mapped: int, carry_val, clone) -> fx.GraphModule:
    """scan combine function for map: (carry, *x_slices, *operands) -> (carry copy, *f(...))."""
    g = fx.Graph()
    carry = g.placeholder("carry")
    carry.meta["val"] = carry_val
    f_phs = [n for n in f.graph.nodes if n.op == "placeholder"]
    env = {}
    for src in f_phs:
        p = g.placeholder(src.name)
        p.meta = dict(src.meta)
        env[src] = p
    root = torch.nn.Module()
    outs = None
    for n in f.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            outs = n.args[0]
            break
        if n.op == "get_attr":
            setattr(root, n.target, getattr(f, n.target))
        env[n] = g.node_copy(n, lambda a: env[a])
    outs = outs if isinstance(outs, (list, tuple)) else (outs,)
    g.output([g.call_function(clone, (carry,)), *[env[o] for o in outs]])
    return fx.GraphModule(root, g, class_name="MapStep")


class MapToScanPass(ExportPass):
    """`map(f, xs, *operands)` -> `scan` with a dummy carry, so the mapped dimension stays dynamic.

    executorch's `to_edge` retraces `map` by unstacking its input, which specialises a dynamic
    mapped dimension to the example size: the program then bakes that size into every value that
    depends on it (wrong values at other sizes) and refuses larger inputs. `scan` is retraced
    from its body's placeholders and stays dynamic. Run this on the ATen program *before*
    `to_edge` (`etfuse.to_edge` does); on an edge program it is too late for values that
    were already specialised, which `etfuse.to_edge` reports as an error.
    """

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if not has_hop(graph_module, torch.ops.higher_order.map_impl):
            return PassResult(copy_graph_module(graph_module), True)  # never the caller's module (graph_copy)
        with torch.no_grad():  # as in LoopLoweringPass: an inference retrace needs no autograd
            return PassResult(copy_graph_module(super().call(graph_module).graph_module), True)

    def call_map(self, f, mapped_args, operands, meta):
        from executorch.exir.dialects.edge._ops import EdgeOpOverload

        is_edge = any(isinstance(n.target, EdgeOpOverload) for n in f.graph.nodes if n.op == "call_function")
        clone = _CLONE if is_edge else aten.clone.default
        full = edge.full.default if is_edge else aten.full.default
        carry = self.call_operator(full, ([], 0), _FULL_KWARGS, meta)
        step = _map_step_module(f, len(mapped_args), carry.data, clone)
        result = self.call_scan(step, [carry], list(mapped_args), list(operands), meta)
        n_out = len(result.data) - 1
        return _MapOutputs([super(MapToScanPass, self).call_getitem(result, i + 1, meta) for i in range(n_out)])

    def call_getitem(self, value, key, meta):
        if isinstance(value, _MapOutputs):
            return value.items[key]
        return super().call_getitem(value, key, meta)


class SpecialisedShapeError(EtfuseError, RuntimeError):
    """`to_edge` turned a dynamic dimension into a constant."""


def refuse_specialised(program) -> None:
    """Raise `SpecialisedShapeError` if an edge program carries the mark of a `Dim` that lowering
    turned into a constant: a range constraint keyed by a number (e.g. `{4: VR[4, 4]}` after
    executorch's `to_edge` unstacked a dynamic `map`). Such a program bakes the example size into
    values computed from it, so it would return wrong values at other sizes."""
    import sympy

    fixed = [f"{k}: {v}" for k, v in program.range_constraints.items() if isinstance(k, sympy.Number)]
    if fixed:
        raise SpecialisedShapeError(
            f"this program was specialised during lowering ({', '.join(fixed)}): a dynamic dimension became "
            "its example size. Lower it with etfuse.to_edge, which keeps "
            "`map` dynamic.")
