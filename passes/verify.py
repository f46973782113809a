"""Check the nodes etfuse wrote with executorch's own edge-dialect checks, and only those.

`EdgeProgramManager.transform` re-runs executorch's edge verifier over the whole program after
every call, and that verifier re-executes every node on fake tensors: at 4,800 nodes it cost
10x the fusion passes themselves. The program `etfuse.fuse` starts from is already a verified
edge program, and etfuse copies the nodes it does not rewrite unchanged, so `fuse` verifies only
the nodes etfuse wrote (those carrying `meta["etfuse"]`), with the same checks executorch runs on
each node: the target is a valid edge op (`check_valid_op`), and its tensor arguments and
results satisfy the op's dtype constraints, found by running the op on fake tensors
(`EdgeOpArgValidator`). Graph-wide invariants (`_check_tensors_are_contiguous`) run on every
graph, as they are cheap.

Both checks are functions of the node's op and of its arguments' and result's values (for a
tensor: its type, dtype, shape, strides, offset, device, whether it requires grad, which other
argument it is), so a node with the same signature as one that passed in the same graph passes
without running the op again. A model repeats its layers, so most nodes etfuse writes repeat one
(an add+relu chain: 8,000 nodes, one op run; the op run was 40% of `fuse` at 16,000 nodes).
A node whose signature holds anything else (a symbolic size, an object) is always run.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.capture._config import EdgeCompileConfig
from executorch.exir.error import InternalError
from executorch.exir.verification.arg_validator import EdgeOpArgValidator
from executorch.exir.verification.verifier import EXIREdgeDialectVerifier, _check_tensors_are_contiguous
from torch._dispatch.python import enable_python_dispatcher
from torch._export.utils import _detect_fake_mode_from_gm
from torch._export.verifier import SpecViolationError

from .graph_copy import graph_modules


def _written(node: fx.Node) -> bool:
    return node.op == "call_function" and "etfuse" in node.meta


def _value(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def verify_written_nodes(graph_module: fx.GraphModule, compile_config: Optional[EdgeCompileConfig] = None) -> int:
    """Raise `SpecViolationError` naming the node if a node etfuse wrote is not valid edge
    dialect; returns how many nodes were checked."""
    verifier = EXIREdgeDialectVerifier(edge_compile_config=compile_config or EdgeCompileConfig())
    if not verifier.enable:
        return 0
    checked = 0
    for path, gm in graph_modules(graph_module):
        _check_tensors_are_contiguous(gm)
        written = [n for n in gm.graph.nodes if _written(n)]
        if not written:
            continue
        validator = EdgeOpArgValidator(gm)
        fake_mode = _detect_fake_mode_from_gm(gm)
        passed: set = set()  # signatures of the nodes that passed
        for node in written:
            where = f"node {node.name!r} ({node.target}) in graph {path or '<top>'}, written by etfuse"
            if isinstance(node.target, torch._ops.HigherOrderOperator):
                continue  # control flow: its bodies are graphs of their own, checked in this loop
            if isinstance(node.target, torch._ops.OpOverload):
                try:
                    verifier.check_valid_op(node.target)
                except SpecViolationError as e:
                    raise SpecViolationError(f"{where}: {e}") from e
            if "val" not in node.meta:
                raise SpecViolationError(f"{where}: no meta['val']")
            args = fx.map_arg(node.args, _value)
            kwargs = fx.map_arg(node.kwargs, _value)
            signature = _signature(node.target, args, kwargs, node.meta["val"])
            if signature is not None and signature in passed:
                checked += 1
                continue
            validator.node = node
            try:
                with enable_python_dispatcher(), (fake_mode or torch._subclasses.FakeTensorMode()):
                    validator.call_function(node.target, args, kwargs)
            except Exception as e:  # noqa: BLE001 - any failure to run the op is a violation
                raise InternalError(f"{where}: {type(e).__name__}: {e}") from e
            if validator.violating_ops:
                (op, (dtypes, _)), = validator.violating_ops.items()
                raise SpecViolationError(f"{where}: tensor dtypes {dtypes} are not allowed for {op}")
            if signature is not None:
                passed.add(signature)
            checked += 1
    return checked


_SCALARS = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _signature(target, args, kwargs, result) -> Optional[tuple]:
    """A hashable description of everything the checks of a node read, equal for two nodes only
    if the checks give both the same answer; None if some value has no such description."""
    aliases: dict[int, int] = {}  # id(tensor) -> position of its first appearance

    def describe(v):
        if isinstance(v, torch.Tensor):
            if v.layout is not torch.strided:
                return None
            shape, strides, offset = tuple(v.shape), tuple(v.stride()), v.storage_offset()
            if not all(type(d) is int for d in (*shape, *strides, offset)):
                return None  # a symbolic size: always run the op
            return (type(v), v.dtype, shape, strides, offset, v.device, v.requires_grad, v.is_conj(), v.is_neg(),
                    aliases.setdefault(id(v), len(aliases)))
        if type(v) is float:
            return (float, v.hex())  # 0.0 and -0.0 apart; a NaN equal to itself
        if isinstance(v, _SCALARS):
            return (type(v), v)
        if isinstance(v, (list, tuple)):
            items = tuple(describe(x) for x in v)
            return None if None in items else (type(v), items)
        if isinstance(v, dict):
            items = tuple((k, describe(x)) for k, x in v.items())
            return None if any(d is None for _, d in items) else (dict, items)
        return None

    parts = (describe(args), describe(kwargs), describe(result))
    return None if None in parts else (target, *parts)
