"""Evaluate, once, the weight-only subgraphs etfuse's passes wrote (`meta["etfuse"]["fold_constants"]`).

A graph-module pass cannot read a parameter's value (only the `ExportedProgram` holds it), so
passes such as `BatchNormFoldPass` write the arithmetic on the weights as graph ops. Given the
whole program, `fold_constants` runs those ops on the real tensors and puts the results in the
program as constants (CONSTANT_TENSOR inputs), so the `.pte` carries folded weights and runs no
extra op. A marked node is folded when every input is a parameter, a buffer the program never
mutates, a lifted constant, or another folded node; parameters nothing reads any more are dropped.
`etfuse.fuse` calls it; after `edge.transform(default_passes())` call it yourself. A pass may name
a folded tensor with `meta["etfuse"]["name"]`.

The caller's program is not modified: the result has a new graph module, signature, state_dict
and constants (the tensors themselves are shared).
"""

from __future__ import annotations

import copy
from typing import Union

import torch
import torch.fx as fx
from executorch.exir import EdgeProgramManager
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult, ExportPass, PassResult
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from .graph_copy import copy_graph_module, program_with

MARK = "fold_constants"
_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _marked(node: fx.Node) -> bool:
    return node.op == "call_function" and bool(node.meta.get("etfuse", {}).get(MARK))


def _constant_values(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """placeholder name -> value, for the inputs that are constants of the program."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    out = {}
    for spec in sig.input_specs:
        if spec.kind not in _CONSTANT_KINDS or not isinstance(spec.arg, TensorArgument):
            continue
        if spec.kind == InputKind.BUFFER and spec.target in mutated:
            continue
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            out[spec.arg.name] = ep.state_dict[spec.target]
        else:
            out[spec.arg.name] = ep.constants[spec.target]
    return out


def fold_constants(program: Union[ExportedProgram, EdgeProgramManager]):
    """`program` with every foldable marked subgraph replaced by constants (same type back)."""
    if isinstance(program, EdgeProgramManager):
        folded = copy.copy(program)
        folded._edge_programs = {name: fold_constants(ep) for name, ep in program._edge_programs.items()}
        return folded
    ep = program
    if not any(_marked(n) for n in ep.graph.nodes):
        return ep
    values = _constant_values(ep)
    env: dict[str, torch.Tensor] = {}  # folded node name -> value
    for n in ep.graph.nodes:
        if not _marked(n):
            continue
        inputs = []
        fx.map_arg((n.args, n.kwargs), inputs.append)
        if all(a.name in env or a.name in values for a in inputs):
            args, kwargs = fx.map_arg((n.args, n.kwargs), lambda a: env.get(a.name, values.get(a.name)))
            with torch.no_grad():
                env[n.name] = n.target(*args, **kwargs)
    if not env:
        return ep
    return _with_constants(ep, env)


def _with_constants(ep: ExportedProgram, env: dict[str, torch.Tensor]) -> ExportedProgram:
    gm = copy_graph_module(ep.graph_module)
    graph = gm.graph
    nodes = {n.name: n for n in graph.nodes}
    fold_inputs = {a.name for name in env for a in nodes[name].all_input_nodes}
    old_specs = {s.arg.name: s for s in ep.graph_signature.input_specs if isinstance(s.arg, TensorArgument)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_user_input = next((n for n in placeholders if n.name not in old_specs
                             or old_specs[n.name].kind == InputKind.USER_INPUT), None)
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    constants, state_dict = dict(ep.constants), dict(ep.state_dict)
    new_specs: dict[str, InputSpec] = {}
    for name, value in env.items():
        node = nodes[name]
        if all(u.name in env for u in node.users):
            continue  # only an input of other folded nodes
        if first_user_input is not None:
            ctx = graph.inserting_before(first_user_input)
        else:
            ctx = graph.inserting_after(placeholders[-1])
        with ctx:
            const = graph.placeholder(f"_etfuse_folded_{node.meta['etfuse'].get('name', name)}")
        value = value.contiguous()
        const.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
        constants[const.name] = value
        new_specs[const.name] = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(const.name), const.name)
        node.replace_all_uses_with(const)
    for n in reversed(list(graph.nodes)):
        if n.name in env and not n.users:
            graph.erase_node(n)
    # Parameters / buffers / constants the folds made unused go, with their data.
    removed = []
    for n in list(graph.nodes):
        spec = old_specs.get(n.name)
        if n.op == "placeholder" and n.name in fold_inputs and not n.users and spec is not None:
            graph.erase_node(n)
            removed.append(spec)
    graph.lint()
    gm.recompile()
    specs = [new_specs.get(n.name) or old_specs[n.name] for n in graph.nodes if n.op == "placeholder"]
    kept = {s.target for s in specs if s.kind != InputKind.USER_INPUT}
    for spec in removed:
        if spec.target not in kept:
            state_dict.pop(spec.target, None)
            constants.pop(spec.target, None)
    signature = ExportGraphSignature(input_specs=specs, output_specs=copy.copy(ep.graph_signature.output_specs))
    return program_with(ep, gm, signature, state_dict, constants)


class ConstantFoldingPass(ExportPass, ExportedProgramPassBase):
    """`fold_constants` as the last pass of `default_passes()`, for every route.

    executorch's `EdgeProgramManager.transform` hands an `ExportedProgramPassBase` the whole
    program, so there the fold subgraphs become constants, as in `etfuse.fuse`.
    `to_executorch(ExecutorchBackendConfig(passes=...))` calls passes with the graph module only:
    there this pass returns a copy of it and the fold subgraphs run per call.
    """

    def __call__(self, program):
        return self.call(program)

    def call(self, program):
        if isinstance(program, ExportedProgram):
            return ExportedProgramPassResult(fold_constants(program), True)
        return PassResult(copy_graph_module(program), True)  # graph module only: nothing to read values from

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
