"""Copies of graph modules that share nothing a later stage rewrites.

executorch's `to_executorch` rewrites a program's graph modules in place (out variants,
`memory.alloc`, control-flow bodies), so two programs that share a graph module, or a body
inside one, corrupt each other when either is lowered. Every etfuse pass therefore returns
graph modules of its own, made here: each graph (top and every control-flow body, nested) is a
new `fx.Graph`; tensors, fake values and other attributes are shared, because nothing rewrites
them.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

import torch.fx as fx
from executorch.exir._program_utils import _get_updated_graph_signature, _get_updated_range_constraints
from executorch.exir.pass_base import ExportedProgramPassBase
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassResult
from torch.export.graph_signature import ExportGraphSignature

# (graph module, its path) -> the new graph for it; the default copies the graph as it is.
GraphRewrite = Callable[[fx.GraphModule, str], fx.Graph]


def graph_modules(gm: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    """The top graph module and every nested one (control-flow bodies), top first."""
    return [(name, m) for name, m in gm.named_modules() if isinstance(m, fx.GraphModule)]


def has_hop(gm: fx.GraphModule, hop) -> bool:
    """Does `gm` or any nested body call the higher-order op `hop`?"""
    return any(n.op == "call_function" and n.target is hop for _, m in graph_modules(gm) for n in m.graph.nodes)


def copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    new._codegen = copy.deepcopy(graph._codegen)
    env: dict[fx.Node, fx.Node] = {}
    lookup = env.__getitem__
    for node in graph.nodes:
        env[node] = new.node_copy(node, lookup)
    return new


def copy_graph_module(gm: fx.GraphModule, rewrite: Optional[GraphRewrite] = None) -> fx.GraphModule:
    """A new graph module for `gm` and for every graph module inside it; `rewrite(module, path)`
    builds each new graph (default: a plain copy). A body used under two names stays one module."""
    done: dict[int, fx.GraphModule] = {}

    def visit(m: fx.GraphModule, path: str) -> fx.GraphModule:
        if id(m) in done:
            return done[id(m)]
        graph = rewrite(m, path) if rewrite else copy_graph(m.graph)
        new = fx.GraphModule(m, graph, class_name=type(m).__name__)
        new.meta.update(m.meta)
        for name, child in m.named_children():
            if isinstance(child, fx.GraphModule):
                setattr(new, name, visit(child, f"{path}.{name}" if path else name))
        done[id(m)] = new
        return new

    return visit(gm, "")


def program_with(ep: ExportedProgram, gm: fx.GraphModule, signature: Optional[ExportGraphSignature] = None,
                 state_dict: Optional[dict] = None, constants: Optional[dict] = None) -> ExportedProgram:
    """`ep` with a new graph module (and, if given, signature, state_dict, constants), built the
    way executorch's pass manager does: no re-verification of the whole program (the caller
    verifies what it wrote, see `verify.py`); `ep` itself is unchanged."""
    new = copy.copy(ep)
    new._graph_module = gm
    new._graph_signature = signature if signature is not None else _get_updated_graph_signature(ep.graph_signature, gm)
    new._range_constraints = _get_updated_range_constraints(gm)
    new._module_call_graph = copy.deepcopy(ep._module_call_graph)
    if state_dict is not None:
        new._state_dict = state_dict
    if constants is not None:
        new._constants = constants
    return new


def editable_copy(ep: ExportedProgram) -> ExportedProgram:
    """`ep` with a graph module, signature, state dict and constants dict of its own, which a pass
    may edit (the tensors stay shared)."""
    return program_with(ep, copy_graph_module(ep.graph_module), copy.deepcopy(ep.graph_signature),
                        dict(ep.state_dict), dict(ep.constants))


class ValuesPass(ExportedProgramPassBase):
    """A pass that needs the program's values (constant weights). Given a graph module alone
    (`ExecutorchBackendConfig(passes=...)` hands passes only that) it returns a copy, unchanged;
    `modified` stays True there, as executorch's pass manager then keeps the returned module."""

    def __call__(self, program):
        if isinstance(program, fx.GraphModule):
            return PassResult(copy_graph_module(program), True)
        return super().__call__(program)
