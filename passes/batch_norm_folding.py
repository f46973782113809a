"""BatchNormFoldPass: convolution / linear -> batch norm (eval) becomes one convolution / linear
whose weight and bias are new constants of the program.

    y = (conv(x, w, b) - mean) / sqrt(var + eps) * gamma + beta
      = conv(x, w * s, (b - mean) * s + beta)            s = gamma / sqrt(var + eps), per channel

Folding needs the *values* of w, b, gamma, beta, mean and var. In an edge program they are
lifted placeholders whose data live in the ExportedProgram (`state_dict`, `constants`), not in
the graph module an ExportPass sees, so this is an `ExportedProgramPassBase`: it reads them
through the graph signature, adds the folded tensors as CONSTANT_TENSOR inputs (placeholder +
input spec + `constants` entry) and drops the parameters/buffers nothing reads any more.

A batch norm is folded when it is `_native_batch_norm_legit_no_training` (eval), only its
output 0 is used, its input is a 2-D convolution (not transposed) or a linear
(`addmm(b, x, permute_copy(w))` / `mm(x, permute_copy(w))`) with no other user, and every
tensor above is a parameter, a buffer the program never mutates, or a lifted constant. Anything
else stays as it is and is named in `report.declined` with the reason.

The caller's program is never modified: a folded program gets a new graph module, signature,
state_dict and constants.
"""

from __future__ import annotations

import copy
import operator
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from .engine import Declined, Fused, FusionReport
from .fusion_pass import graph_modules

aten = torch.ops.aten
RULE = "batch_norm_fold"
_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _aten(target):
    return getattr(target, "_op", target)


def _is(node, op) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and _aten(node.target) == op


class _Fold:
    """One foldable producer -> batch norm, found on the caller's graph (by node name)."""

    def __init__(self, kind, producer, bn, getitem, weight, bias, permute, stats):
        self.kind = kind  # "conv" or "linear"
        self.producer, self.bn, self.getitem = producer, bn, getitem
        self.weight, self.bias, self.permute = weight, bias, permute  # placeholders / permute_copy node
        self.stats = stats  # gamma, beta, mean, var: placeholders or None
        self.eps = float(bn.args[6])


class BatchNormFoldPass(ExportedProgramPassBase):
    """Folds eval-mode batch norm into the convolution / linear that feeds it; see `report`."""

    def __init__(self):
        self.report = FusionReport()

    # ---- reading constants through the signature ------------------------------------------

    def _constant(self, ep: ExportedProgram, node, what: str) -> tuple[Optional[torch.Tensor], Optional[str]]:
        """(tensor, None) when `node` is a constant of the program, else (None, why not)."""
        if node is None:
            return None, None
        if not isinstance(node, fx.Node) or node.op != "placeholder":
            return None, f"{what} is computed by {getattr(node, 'name', node)!r}, not a constant of the program"
        spec = self._specs.get(node.name)
        if spec is None or spec.kind not in _CONSTANT_KINDS:
            return None, f"{what} ({node.name}) is a {spec.kind.name.lower() if spec else 'graph'} input, not a constant of the program"
        if spec.kind == InputKind.BUFFER and spec.target in self._mutated:
            return None, f"{what} ({node.name}) is a buffer the program mutates"
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return ep.state_dict[spec.target], None
        return ep.constants[spec.target], None

    # ---- finding folds (pure) -----------------------------------------------------------------

    def _plan(self, ep: ExportedProgram, bn: fx.Node) -> tuple[Optional[_Fold], Optional[str]]:
        getitems = [u for u in bn.users]
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
            kind, weight, bias, permute = "conv", x.args[1], x.args[2], None
        elif _is(x, aten.addmm.default) or _is(x, aten.mm.default):
            permute = x.args[2] if _is(x, aten.addmm.default) else x.args[1]
            if not _is(permute, aten.permute_copy.default) or list(permute.args[1]) != [1, 0] or len(permute.users) != 1:
                return None, "the producer is a matmul whose weight is not a linear weight (permute_copy(w, [1, 0]))"
            if _is(x, aten.addmm.default) and (x.kwargs.get("beta", 1) != 1 or x.kwargs.get("alpha", 1) != 1):
                return None, "addmm with beta/alpha != 1"
            kind, weight, bias = "linear", permute.args[0], (x.args[0] if _is(x, aten.addmm.default) else None)
        else:
            return None, f"the batch norm input comes from {getattr(x, 'name', x)!r}, not a convolution or linear"
        values = {}
        names = ("weight", "bias", "batch norm weight", "batch norm bias", "running_mean", "running_var")
        for what, node in zip(names, (weight, bias, *bn.args[1:5])):
            t, why = self._constant(ep, node, what)
            if why:
                return None, f"not folded: {why}"
            if t is not None and t.dtype != torch.float32:
                return None, f"not folded: {what} has dtype {t.dtype}"
            values[what] = t
        if kind == "linear" and bias is not None and values["bias"].dim() != 1:
            return None, f"not folded: linear bias has shape {tuple(values['bias'].shape)}"
        fold = _Fold(kind, x, bn, getitem, weight, bias, permute, bn.args[1:5])
        fold.values = values
        return fold, None

    # ---- the pass ---------------------------------------------------------------------------

    def call(self, ep: ExportedProgram) -> ExportedProgramPassResult:
        self.report = FusionReport()
        sig = ep.graph_signature
        self._specs = {s.arg.name: s for s in sig.input_specs if isinstance(s.arg, TensorArgument)}
        self._mutated = set(sig.buffers_to_mutate.values())
        bn_op = aten._native_batch_norm_legit_no_training.default
        folds = []
        for path, gm in graph_modules(ep.graph_module):
            for bn in gm.graph.nodes:
                if not _is(bn, bn_op):
                    continue
                if path:
                    self.report.declined.append(Declined(
                        RULE, path, bn.name, "batch norm inside a control-flow body: its statistics are body "
                        "operands, not constants the pass can read"))
                    continue
                fold, why = self._plan(ep, bn)
                if why:
                    self.report.declined.append(Declined(RULE, path, bn.name, why))
                else:
                    folds.append(fold)
        if not folds:
            return ExportedProgramPassResult(ep, False)
        return ExportedProgramPassResult(self._rewrite(ep, folds), True)

    @staticmethod
    def _folded(fold: _Fold) -> tuple[torch.Tensor, torch.Tensor]:
        v = {k: (t.detach().double() if t is not None else None) for k, t in fold.values.items()}
        w = v["weight"]
        cout = w.shape[0]
        gamma = v["batch norm weight"] if v["batch norm weight"] is not None else torch.ones(cout, dtype=torch.float64)
        beta = v["batch norm bias"] if v["batch norm bias"] is not None else torch.zeros(cout, dtype=torch.float64)
        scale = gamma / torch.sqrt(v["running_var"] + fold.eps)
        b = v["bias"] if v["bias"] is not None else torch.zeros(cout, dtype=torch.float64)
        new_w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
        new_b = (b - v["running_mean"]) * scale + beta
        return new_w.float().contiguous(), new_b.float().contiguous()

    def _rewrite(self, ep: ExportedProgram, folds: list[_Fold]) -> ExportedProgram:
        gm = copy.deepcopy(ep.graph_module)  # the caller's program stays as it was
        graph = gm.graph
        nodes = {n.name: n for n in graph.nodes}
        constants = dict(ep.constants)
        state_dict = dict(ep.state_dict)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        first_user_input = next((n for n in placeholders if self._specs.get(n.name) is None
                                 or self._specs[n.name].kind == InputKind.USER_INPUT), None)
        fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders if "val" in n.meta])
        new_specs: dict[str, InputSpec] = {}
        touched: set[str] = set()

        def constant_placeholder(name: str, value: torch.Tensor) -> fx.Node:
            if first_user_input is not None:
                ctx = graph.inserting_before(nodes[first_user_input.name])
            else:
                ctx = graph.inserting_after(next(n for n in reversed(graph.nodes) if n.op == "placeholder"))
            with ctx:
                node = graph.placeholder(name)
            node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
            constants[node.name] = value
            new_specs[node.name] = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), node.name)
            return node

        for fold in folds:
            new_w, new_b = self._folded(fold)
            producer = nodes[fold.producer.name]
            base = f"_etfuse_folded_{producer.name}"
            w_node = constant_placeholder(f"{base}_weight", new_w)
            b_node = constant_placeholder(f"{base}_bias", new_b)
            touched.update(n.name for n in (fold.weight, fold.bias, *fold.stats) if isinstance(n, fx.Node))
            if fold.kind == "conv":
                args = list(producer.args)
                args[1], args[2] = w_node, b_node
                producer.args = tuple(args)
                result = producer
            else:
                permute = nodes[fold.permute.name]
                permute.args = (w_node, *permute.args[1:])
                if _is(producer, aten.addmm.default):
                    producer.args = (b_node, *producer.args[1:])
                    result = producer
                else:  # mm(x, wT) -> addmm(b, x, wT)
                    with graph.inserting_before(producer):
                        result = graph.call_function(exir_ops.edge.aten.addmm.default, (b_node, *producer.args))
                    result.meta = dict(producer.meta)
                    producer.replace_all_uses_with(result)
                    graph.erase_node(producer)
            getitem, bn = nodes[fold.getitem.name], nodes[fold.bn.name]
            getitem.replace_all_uses_with(result)
            for user in list(bn.users):
                graph.erase_node(user)
            graph.erase_node(bn)
            self.report.fused.append(Fused(RULE, "", result.name, [bn.name, getitem.name]))
        # Parameters / buffers the folds made unused go, with their data.
        removed = set()
        for name in touched:
            node = nodes[name]
            if node.op == "placeholder" and not node.users:
                graph.erase_node(node)
                removed.add(name)
        graph.lint()
        gm.recompile()

        specs = []
        for n in graph.nodes:
            if n.op != "placeholder":
                continue
            spec = new_specs.get(n.name) or self._specs.get(n.name)
            specs.append(spec)
        kept_targets = {s.target for s in specs if s.kind != InputKind.USER_INPUT}
        for name in removed:
            spec = self._specs[name]
            if spec.target not in kept_targets:
                state_dict.pop(spec.target, None)
                constants.pop(spec.target, None)
        outputs = next(n for n in graph.nodes if n.op == "output").args[0]
        out_specs = []
        for spec, value in zip(ep.graph_signature.output_specs, outputs):
            if isinstance(spec.arg, TensorArgument) and isinstance(value, fx.Node) and value.name != spec.arg.name:
                spec = copy.copy(spec)
                spec.arg = TensorArgument(value.name)
            out_specs.append(spec)
        return ExportedProgram(
            root=gm,
            graph=gm.graph,
            graph_signature=ExportGraphSignature(input_specs=specs, output_specs=out_specs),
            state_dict=state_dict,
            range_constraints=copy.copy(ep.range_constraints),
            module_call_graph=copy.deepcopy(ep._module_call_graph),
            example_inputs=ep.example_inputs,
            constants=constants,
            verifiers=[ep.verifier],
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
