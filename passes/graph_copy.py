"""Copies of graph modules that share nothing a later stage rewrites.

executorch's `to_executorch` rewrites a program's graph modules in place (out variants,
`memory.alloc`, control-flow bodies), so two programs that share a graph module, or a body
inside one, corrupt each other when either is lowered. Every etfuse pass therefore returns
graph modules of its own, made here: each graph (top and every control-flow body, nested) is a
new `fx.Graph`; tensors, fake values and other attributes are shared, because nothing rewrites
them.

The modules made here generate their Python code when first needed (torch's `_LazyGraphModule`:
on the first call, `gm.code` or `str(gm)`), not when built: `etfuse.fuse` makes a dozen modules
of which it reads only the graphs, and generating and compiling a module's code costs about as
much as copying its graph (over a third of `fuse` at 16,000 nodes, and a little more than linear
in the graph's size; benchmarks/pass_scaling.py).

A pass that changes nothing still returns a copy, except to `etfuse.fuse`: it owns the module it
hands each pass (its own copy of the caller's, or what the previous pass returned), so within
`owned(gm)` a pass that changes nothing returns `gm` itself (`unchanged`) and fuse goes on with
it. Most of the default passes change nothing in most programs (no loops, no conds, no unit-dim
copies): at 16,000 nodes their copies and the garbage collections they caused were nearly half
of `fuse`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from typing import Callable, Iterator, Optional

import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule
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
        new = _LazyGraphModule(m, graph, class_name=type(m).__name__)  # its code generated when first needed
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


_OWNED: contextvars.ContextVar[Optional[fx.GraphModule]] = contextvars.ContextVar("etfuse_owned_module", default=None)


@contextlib.contextmanager
def owned(gm: fx.GraphModule) -> Iterator[None]:
    """Within: the caller owns `gm` (nothing else holds it, it is dropped when replaced), so a pass
    that leaves it unchanged may hand `gm` itself back (`unchanged`). `etfuse.fuse` runs each pass so."""
    token = _OWNED.set(gm)
    try:
        yield
    finally:
        _OWNED.reset(token)


def unchanged(gm: fx.GraphModule, copy_modified: bool = True) -> PassResult:
    """What a pass that changed nothing in `gm` returns: `gm` itself with `modified` False where its
    caller owns it (`owned`), else a copy (never the caller's module) with `modified` `copy_modified`."""
    if _OWNED.get() is gm:
        return PassResult(gm, False)
    return PassResult(copy_graph_module(gm), copy_modified)


class ValuesPass(ExportedProgramPassBase):
    """A pass that needs the program's values (constant weights). Given a graph module alone
    (`ExecutorchBackendConfig(passes=...)` hands passes only that) it returns a copy, unchanged;
    `modified` stays True there, as executorch's pass manager then keeps the returned module."""

    def __call__(self, program):
        if isinstance(program, fx.GraphModule):
            return PassResult(copy_graph_module(program), True)
        return super().__call__(program)
