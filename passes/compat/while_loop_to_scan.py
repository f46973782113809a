"""LoopLoweringPass: `while_loop` (ONNX Loop) -> a bounded `scan` the ExecuTorch runtime runs.

Upstream (executorch 1.5.1): `to_edge` lowers `while_loop`, but `to_executorch` cannot emit it
("Unsupported control flow operator: while_loop"); `torch.cond`, `map` and `scan` run.
Delete this module when executorch emits `while_loop` (tests/test_compat.py shows the failure). A loop whose trip count has a known bound B becomes

    scan(step, init=carried, xs=[full([B], 0)], additional_inputs=additional)
    step(*carried, _, *additional):
        go = cond_fn(*carried, *additional)
        return cond(go, body_fn, keep, (*carried, *additional))   # keep returns the carried values

which is ONNX Loop with max trip count M = B and condition `cond_fn`: loop-carried values flow
through the scan carry, the body never runs after the condition first fails (early exit), and
the result is the carried values of the last iteration that ran. No keep-going flag needs to be
carried: once `cond_fn` is false the carried values stop changing, so `cond_fn` stays false
(it is a pure function of the carried and additional values).

The bound B comes from, in order:
  * the loop itself: `cond_fn` is `i < L` or `i <= L` (possibly `&`-ed with anything else) for a
    carried counter `i` that `body_fn` increments by a positive constant, starting from a
    constant, where `L` is a constant or a SymInt whose range is bounded (a `Dim` max);
  * `max_trip_count=M` given to the pass: the ONNX Loop `M` input. The lowered loop then stops
    after M iterations even if `cond_fn` still holds (ONNX Loop semantics, not torch's
    unbounded `while_loop`); `report` says which loops were bounded this way.
A loop with no bound is a `LoopLoweringError` naming the loop and why.

The pass retraces the program (an `ExportPass`), so the caller's graph module is not modified.
"""

from __future__ import annotations

__all__ = ["CONSTANT_VALUE", "LoopLoweringPass", "LoopLoweringError", "LoweredLoop"]

import dataclasses
import math
import operator
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult, ProxyValue
from etfuse.errors import EtfuseError
from etfuse.patterns.rule import CONSTANT_VALUE  # where `etfuse.fuse` records a constant input's value
from ..graph_copy import copy_graph_module, has_hop, unchanged

aten = torch.ops.aten
edge = exir_ops.edge.aten
_CLONE = exir_ops.edge.dim_order_ops._clone_dim_order.default  # edge graphs are in dim-order mode


_FULL_KWARGS = {"dtype": torch.float32, "layout": torch.strided, "device": torch.device("cpu"), "pin_memory": False}


class LoopLoweringError(EtfuseError, RuntimeError):
    """A `while_loop` cannot be lowered to a bounded scan; the message says which and why."""


@dataclasses.dataclass
class LoweredLoop:
    node: str  # the while_loop node's name
    trip_bound: int
    source: str  # "counter i < L" / "max_trip_count"


def _aten(target):
    return getattr(target, "_op", target)


_AND = {aten.logical_and.default, aten.bitwise_and.Tensor}
_LT = {aten.lt.Scalar, aten.lt.Tensor}
_LE = {aten.le.Scalar, aten.le.Tensor}
_GT = {aten.gt.Tensor}  # L > i, counter second
_GE = {aten.ge.Tensor}
_ADD = {aten.add.Tensor, aten.add.Scalar}


# Ops that pass a value through unchanged: a counter initialised as `torch.tensor(0)` reaches the
# loop as a lifted constant behind `_clone_dim_order` after to_edge.
_PASS_THROUGH = {aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten._to_copy.default,
                 torch.ops.dim_order_ops._clone_dim_order.default, torch.ops.dim_order_ops._to_dim_order_copy.default}


def _constant(gm: Optional[fx.GraphModule], value, known: Optional[dict] = None) -> Optional[float]:
    """The number a graph argument holds when it is a literal or a one-element constant."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, torch.SymInt):
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and not isinstance(value, torch._subclasses.FakeTensor):
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # the pass runs under fake mode: read the real value
                return value.item()
        const = getattr(value, "constant", None)
        return None if const is None else _constant(gm, const)
    if isinstance(value, fx.Node):
        if value.op == "placeholder":
            if known and value.name in known:
                return _constant(gm, known[value.name])
            return _constant(gm, value.meta.get(CONSTANT_VALUE)) if CONSTANT_VALUE in value.meta else None
        if value.op == "get_attr" and gm is not None:
            return _constant(gm, getattr(gm, value.target))
        t = _aten(value.target) if value.op == "call_function" else None
        if t in (aten.full.default,) and value.args[0] in ([], (), [1]):
            return _constant(gm, value.args[1], known)
        if t in (aten.scalar_tensor.default,):
            return _constant(gm, value.args[0], known)
        if t in _PASS_THROUGH:
            return _constant(gm, value.args[0], known)
    return None


def _upper_bound(gm: Optional[fx.GraphModule], value, known: Optional[dict] = None) -> Optional[float]:
    """An upper bound of a graph value: a constant, or a SymInt with a bounded range."""
    c = _constant(gm, value, known)
    if c is not None:
        return c
    v = value.meta.get("val") if isinstance(value, fx.Node) else value
    if isinstance(v, torch.SymInt):
        from torch.utils._sympy.value_ranges import bound_sympy

        node = v.node
        upper = bound_sympy(node.expr, node.shape_env.var_to_range).upper
        return None if not upper.is_finite else int(upper)
    return None


def _conjuncts(node):
    if isinstance(node, fx.Node) and node.op == "call_function" and _aten(node.target) in _AND:
        for a in node.args[:2]:
            yield from _conjuncts(a)
    else:
        yield node


def _infer_bound(cond_gm: fx.GraphModule, body_gm: fx.GraphModule, init: list, n_carried: int,
                 additional: Optional[list] = None, known: Optional[dict] = None):
    """(bound, why) from a counter comparison in cond_fn, or (None, why not). `init` holds the
    carried values' (outer node, value), `additional` the outer nodes of the extra operands,
    `known` the values of the program's one-element constant inputs by placeholder name."""
    phs = [n for n in cond_gm.graph.nodes if n.op == "placeholder"]
    body_phs = [n for n in body_gm.graph.nodes if n.op == "placeholder"]
    body_out = next(n for n in body_gm.graph.nodes if n.op == "output").args[0]
    pred = next(n for n in cond_gm.graph.nodes if n.op == "output").args[0]
    pred = pred[0] if isinstance(pred, (list, tuple)) else pred
    reasons = []
    best = None
    for c in _conjuncts(pred):
        if not (isinstance(c, fx.Node) and c.op == "call_function"):
            continue
        t = _aten(c.target)
        if t in _LT | _LE:
            counter, limit, inclusive = c.args[0], c.args[1], t in _LE
        elif t in _GT | _GE:
            counter, limit, inclusive = c.args[1], c.args[0], t in _GE
        else:
            continue
        if counter not in phs[:n_carried]:
            reasons.append(f"{c.name}: its left side is not a carried value")
            continue
        k = phs.index(counter)
        upd = body_out[k]
        if not (isinstance(upd, fx.Node) and upd.op == "call_function" and _aten(upd.target) in _ADD
                and upd.args[0] is body_phs[k]):
            reasons.append(f"{c.name}: body does not compute carried value {k} as itself + step")
            continue
        step = _constant(body_gm, upd.args[1])
        if step is None or step <= 0:
            reasons.append(f"{c.name}: the counter's step is not a positive constant")
            continue
        start = _constant(None, init[k][0], known)
        if start is None:
            start = _constant(None, init[k][1], known)
        if start is None:
            reasons.append(f"{c.name}: the counter's initial value is not a constant")
            continue
        upper = _upper_bound(cond_gm, limit, known)
        if upper is None and limit in phs[n_carried:] and additional:
            upper = _upper_bound(None, additional[phs.index(limit) - n_carried], known)  # a constant operand
        if upper is None:
            reasons.append(f"{c.name}: the limit is neither a constant nor a SymInt with a bounded range")
            continue
        span = upper - start
        trips = max(0, (math.floor(span / step) + 1) if inclusive else math.ceil(span / step))
        if best is None or trips < best[0]:
            best = (int(trips), f"counter {counter.name} {'<=' if inclusive else '<'} {upper} from {start} step {step}")
    if best is not None:
        return best
    return None, "; ".join(reasons) or "cond_fn compares no carried counter with a limit"


def _step_module(cond_gm: fx.GraphModule, body_gm: fx.GraphModule, n_carried: int,
                 n_additional: int, x_val) -> fx.GraphModule:
    """The scan combine function: go = cond_fn(...); cond(go, body_fn, keep, operands)."""
    root = torch.nn.Module()
    g = fx.Graph()
    cond_phs = [n for n in cond_gm.graph.nodes if n.op == "placeholder"]
    carried = [g.placeholder(f"carried_{i}") for i in range(n_carried)]
    x = g.placeholder("iteration")
    x.meta["val"] = x_val
    additional = [g.placeholder(f"additional_{i}") for i in range(n_additional)]
    for p, src in zip(carried + additional, cond_phs):
        p.meta = dict(src.meta)
    env = dict(zip(cond_phs, carried + additional))
    # Inline cond_fn (its own submodules, if any, come along).
    for n in cond_gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            pred = n.args[0]
            pred = env[pred[0]] if isinstance(pred, (list, tuple)) else env[pred]
            break
        if n.op == "get_attr":
            setattr(root, f"cond_{n.target}", getattr(cond_gm, n.target))
            env[n] = g.get_attr(f"cond_{n.target}")
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    keep = _keep_module(body_gm, n_carried)
    root.body = body_gm
    root.keep = keep
    out = g.call_function(torch.ops.higher_order.cond,
                          (pred, g.get_attr("body"), g.get_attr("keep"), [*carried, *additional]))
    g.output([g.call_function(operator.getitem, (out, i)) for i in range(n_carried)])
    return fx.GraphModule(root, g, class_name="LoopStep")


def _keep_module(body_gm: fx.GraphModule, n_carried: int) -> fx.GraphModule:
    """The branch taken once the condition fails: the carried values, copied (a branch may not
    return its inputs)."""
    g = fx.Graph()
    phs = []
    for src in [n for n in body_gm.graph.nodes if n.op == "placeholder"]:
        p = g.placeholder(src.name)
        p.meta = dict(src.meta)
        phs.append(p)
    g.output(tuple(g.call_function(_CLONE, (p,)) for p in phs[:n_carried]))
    return fx.GraphModule(torch.nn.Module(), g, class_name="LoopKeep")


class LoopLoweringPass(ExportPass):
    """Rewrites every `while_loop` (top graph and bodies, nested) into a bounded `scan`.

    `max_trip_count`: the ONNX Loop M for loops whose bound cannot be inferred (see the module
    docstring). `report` lists each lowered loop with its bound and where the bound came from.
    """

    def __init__(self, max_trip_count: Optional[int] = None):
        super().__init__()
        if max_trip_count is not None and max_trip_count < 0:
            raise ValueError(f"max_trip_count must be >= 0, got {max_trip_count}")
        self.max_trip_count = max_trip_count
        self.report: list[LoweredLoop] = []
        self._known: dict = {}

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.report = []
        # values `etfuse.fuse` recorded for the program's one-element constants (lifted `torch.tensor(0)`)
        self._known = {n.name: n.meta[CONSTANT_VALUE] for n in graph_module.graph.nodes
                       if n.op == "placeholder" and CONSTANT_VALUE in n.meta}
        if not has_hop(graph_module, torch.ops.higher_order.while_loop):
            return unchanged(graph_module)  # never the caller's module, unless it owns it (graph_copy)
        # The retrace runs the graph on fake tensors; with grad enabled, a loop whose carry depends
        # on a parameter makes the scan's autograd tracing fail (an inference graph needs no grad).
        with torch.no_grad():
            lowered = copy_graph_module(super().call(graph_module).graph_module)
        # The same holds for every retrace after this pass that etfuse does not run under no_grad:
        # `to_executorch(ExecutorchBackendConfig(passes=default_passes()))` retraces the scan in its
        # own passes (SpecPropPass, ...) with grad enabled, from the placeholders' values, where a
        # parameter's requires grad. Those values say nothing else about an inference program.
        for n in lowered.graph.nodes:
            val = n.meta.get("val") if n.op == "placeholder" else None
            if isinstance(val, torch.Tensor) and val.requires_grad:
                n.meta["val"] = val.detach()
        return PassResult(lowered, True)

    def call_while(self, cond_fn, body_fn, carried_inputs, additional_inputs, meta) -> ProxyValue:
        debug = getattr(self, "node_debug_str", "") or ""
        node_name = debug[1:].split(" ", 1)[0] if debug.startswith("%") else "while_loop"
        for i, c in enumerate(carried_inputs):
            data = c.data if isinstance(c, ProxyValue) else c
            if not isinstance(data, torch.Tensor):
                raise LoopLoweringError(
                    f"while_loop {node_name!r}: carried value {i} is a {type(data).__name__}, not a tensor; "
                    "a scan carry must be a tensor")
        init = [(c.proxy.node, c.data) if isinstance(c, ProxyValue) else (c, c) for c in carried_inputs]
        additional = [c.proxy.node if isinstance(c, ProxyValue) else c for c in additional_inputs]
        bound, why = _infer_bound(cond_fn, body_fn, init, len(carried_inputs), additional, self._known)
        source = why
        if bound is None:
            if self.max_trip_count is None:
                raise LoopLoweringError(
                    f"while_loop {node_name!r} has no known trip-count bound ({why}); write the condition as "
                    "`counter < limit` with a constant or Dim-bounded limit, or pass "
                    "LoopLoweringPass(max_trip_count=M) for ONNX Loop semantics (stop after M iterations)")
            bound, source = self.max_trip_count, "max_trip_count"
        elif self.max_trip_count is not None and self.max_trip_count < bound:
            bound, source = self.max_trip_count, "max_trip_count"
        if bound == 0:
            if source == "max_trip_count":
                raise LoopLoweringError(f"while_loop {node_name!r}: max_trip_count=0 runs no iteration; drop the loop")
            bound = 1  # the condition fails at the start: one step that keeps the initial values
        self.report.append(LoweredLoop(node_name, bound, source))
        xs = self.call_operator(edge.full.default, ([bound], 0), {**_FULL_KWARGS, "dtype": torch.int64}, meta)
        with self.fake_tensor_mode:
            x_val = torch.empty((), dtype=torch.int64)
        step = _step_module(cond_fn, body_fn, len(carried_inputs), len(additional_inputs), x_val)
        return self.call_scan(step, list(carried_inputs), [xs], list(additional_inputs), meta)
