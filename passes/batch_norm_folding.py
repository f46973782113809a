"""BatchNormFoldPass: convolution / linear -> batch norm (eval) becomes one convolution / linear
with a folded weight and bias.

    y = (conv(x, w, b) - mean) / sqrt(var + eps) * gamma + beta
      = conv(x, w * s, (b - mean) * s + beta)            s = gamma * rsqrt(var + eps), per channel

It is an `ExportPass` like every other pass of `default_passes()`, so it runs wherever a graph
module is all there is: `EdgeProgramManager.transform` and `ExecutorchBackendConfig.passes` hand
passes the graph module, whose parameters are placeholders without values. The fold is therefore
written as graph ops on those placeholders (the "fold subgraph": rsqrt, mul, sub, add on
per-channel vectors and one weight-sized mul), marked `meta["etfuse"]["fold_constants"]`.

* `etfuse.fuse` holds the whole program, and evaluates every fold subgraph whose inputs are
  constants of the program once, at fuse time (`fold_constants`): the `.pte` carries the folded
  weight and bias as constants and runs no extra op.
* Through `transform` / `to_executorch(passes=...)` the fold subgraph stays in the program and
  runs per inference (one pass over the weight per folded layer). `fold_constants(edge)` after
  `transform` gives the `fuse` result.

A batch norm is folded when it is `_native_batch_norm_legit_no_training` (eval), only its output
0 is used, its input is a 2-D convolution (not transposed) or a linear
(`addmm(b, x, permute_copy(w))` / `mm(x, permute_copy(w))`) with no other user, and every tensor
is float32. Anything else stays as it is and is named in `report.declined` with the reason.

The caller's graph module is never modified: the pass returns a new one, always.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult
from torch._guards import detect_fake_mode

from .engine import Declined, Fused, FusionReport
from .graph_copy import copy_graph_module, graph_modules

aten = torch.ops.aten
edge = exir_ops.edge.aten
RULE = "batch_norm_fold"
FOLD_MARK = "fold_constants"  # meta["etfuse"][FOLD_MARK]: computed from weights only, foldable


def _aten(target):
    return getattr(target, "_op", target)


def _is(node, op) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and _aten(node.target) == op


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


class _Fold:
    """One foldable producer -> batch norm (nodes of the graph being rewritten)."""

    def __init__(self, kind, producer, bn, getitem, weight, bias, permute):
        self.kind = kind  # "conv" or "linear"
        self.producer, self.bn, self.getitem = producer, bn, getitem
        self.weight, self.bias, self.permute = weight, bias, permute
        self.gamma, self.beta, self.mean, self.var = bn.args[1:5]
        self.eps = float(bn.args[6])


def plan(bn: fx.Node) -> tuple[Optional[_Fold], Optional[str]]:
    """(fold, None) when `bn` can fold into its producer, else (None, why not)."""
    getitems = list(bn.users)
    if not all(u.target is operator.getitem for u in getitems):
        return None, "batch norm result used other than through getitem"
    used = [u for u in getitems if u.users]
    if len(used) != 1 or used[0].args[1] != 0:
        return None, "batch norm's mean/invstd outputs are used"
    getitem = used[0]
    x = bn.args[0]
    if not isinstance(x, fx.Node) or len(x.users) != 1:
        return None, "the batch norm input has other users (folding would change them)"
    if _is(x, aten.convolution.default):
        if x.args[6]:
            return None, "the producer is a transposed convolution"
        if len(x.args[3]) != 2:
            return None, f"the producer is a {len(x.args[3])}-D convolution; only conv2d is folded"
        fold = _Fold("conv", x, bn, getitem, x.args[1], x.args[2], None)
    elif _is(x, aten.addmm.default) or _is(x, aten.mm.default):
        permute = x.args[2] if _is(x, aten.addmm.default) else x.args[1]
        if not _is(permute, aten.permute_copy.default) or list(permute.args[1]) != [1, 0] or len(permute.users) != 1:
            return None, "the producer is a matmul whose weight is not a linear weight (permute_copy(w, [1, 0]))"
        if _is(x, aten.addmm.default) and (x.kwargs.get("beta", 1) != 1 or x.kwargs.get("alpha", 1) != 1):
            return None, "addmm with beta/alpha != 1"
        fold = _Fold("linear", x, bn, getitem, permute.args[0], x.args[0] if _is(x, aten.addmm.default) else None, permute)
        if fold.bias is not None and getattr(_val(fold.bias), "dim", lambda: 0)() != 1:
            return None, f"not folded: linear bias has shape {tuple(_val(fold.bias).shape)}"
    else:
        return None, f"the batch norm input comes from {getattr(x, 'name', x)!r}, not a convolution or linear"
    names = ("weight", "bias", "batch norm weight", "batch norm bias", "running_mean", "running_var")
    for what, node in zip(names, (fold.weight, fold.bias, fold.gamma, fold.beta, fold.mean, fold.var)):
        if node is None:
            if what in ("weight", "running_mean", "running_var"):
                return None, f"not folded: no {what}"
            continue
        v = _val(node)
        if not isinstance(v, torch.Tensor):
            return None, f"not folded: {what} ({getattr(node, 'name', node)}) has no tensor value"
        if v.dtype != torch.float32:
            return None, f"not folded: {what} has dtype {v.dtype}"
    return fold, None


class BatchNormFoldPass(ExportPass):
    """Folds eval-mode batch norm into the convolution / linear that feeds it; see `report`."""

    def __init__(self):
        super().__init__()
        self.report = FusionReport()

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        self.report = FusionReport()
        new_gm = copy_graph_module(graph_module)  # never the caller's module, even when nothing folds
        bn_op = aten._native_batch_norm_legit_no_training.default
        for path, gm in graph_modules(new_gm):
            folds = []
            for bn in gm.graph.nodes:
                if not _is(bn, bn_op):
                    continue
                if path:
                    self.report.declined.append(Declined(
                        RULE, path, bn.name, "batch norm inside a control-flow body: its statistics are body "
                        "operands, computed per iteration"))
                    continue
                fold, why = plan(bn)
                if why:
                    self.report.declined.append(Declined(RULE, path, bn.name, why))
                else:
                    folds.append(fold)
            for fold in folds:
                self._rewrite(gm.graph, fold, path)
            if folds:
                gm.graph.lint()
                gm.recompile()
        return PassResult(new_gm, True)

    def _rewrite(self, graph: fx.Graph, f: _Fold, path: str) -> None:
        producer = f.producer
        fake_mode = detect_fake_mode([_val(f.weight)])
        cout = _val(f.weight).shape[0]
        stack = producer.meta.get("stack_trace")

        def op(target, *args):
            with graph.inserting_before(producer):
                node = graph.call_function(target, args)
            fake_args = [_val(a) if isinstance(a, fx.Node) else a for a in args]
            with fake_mode or torch._subclasses.fake_tensor.unset_fake_temporarily():
                node.meta["val"] = target(*fake_args)
            node.meta["etfuse"] = {"rule": RULE, FOLD_MARK: True}
            if stack:
                node.meta["stack_trace"] = stack
            return node

        # s = gamma * rsqrt(var + eps); w' = w * s (per output channel); b' = (b - mean) * s + beta
        s = op(edge.rsqrt.default, op(edge.add.Scalar, f.var, f.eps))
        if f.gamma is not None:
            s = op(edge.mul.Tensor, s, f.gamma)
        shape = [cout] + [1] * (_val(f.weight).dim() - 1)
        new_w = op(edge.mul.Tensor, f.weight, op(edge.view_copy.default, s, shape))
        shift = op(edge.neg.default, f.mean) if f.bias is None else op(edge.sub.Tensor, f.bias, f.mean)
        new_b = op(edge.mul.Tensor, shift, s)
        if f.beta is not None:
            new_b = op(edge.add.Tensor, new_b, f.beta)
        # the names fold_constants gives the folded tensors
        new_w.meta["etfuse"]["name"] = f"{producer.name}_weight"
        new_b.meta["etfuse"]["name"] = f"{producer.name}_bias"

        if f.kind == "conv":
            args = list(producer.args)
            args[1], args[2] = new_w, new_b
            producer.args = tuple(args)
            result = producer
        else:
            f.permute.args = (new_w, *f.permute.args[1:])
            producer.prepend(f.permute)  # after the fold ops it now reads
            if _is(producer, aten.addmm.default):
                producer.args = (new_b, *producer.args[1:])
                result = producer
            else:  # mm(x, wT) -> addmm(b, x, wT)
                with graph.inserting_before(producer):
                    result = graph.call_function(edge.addmm.default, (new_b, *producer.args))
                result.meta = dict(producer.meta)
                producer.replace_all_uses_with(result)
                graph.erase_node(producer)
        result.meta["val"] = f.getitem.meta["val"]
        f.getitem.replace_all_uses_with(result)
        for user in list(f.bn.users):
            graph.erase_node(user)
        graph.erase_node(f.bn)
        self.report.fused.append(Fused(RULE, path, result.name, [f.bn.name, f.getitem.name]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
