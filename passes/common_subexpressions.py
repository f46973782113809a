"""CommonSubexpressionPass: an op that computes what an earlier op already computed reads the
earlier result instead.

Export traces a module as often as it is called: each layer of executorch's llama builds its
attention mask, `where(mask[input_pos], scalar_tensor(0), scalar_tensor(-inf))`, from its own
copy of the same causal mask (a buffer per layer), so a decoding step of the 6-layer tiny llama
ran 6 `index`, 6 `where` and 12 `scalar_tensor` where 1, 1 and 2 do (about 15 us of a 0.3 ms
int4 step).

With the program in hand, constants of equal values (parameters, buffers nothing mutates, lifted
constants: same dtype, shape and elements) first become one placeholder, so the .pte holds them
once. Given a graph module alone (`ExecutorchBackendConfig(passes=...)`) there are no values and
only the ops are merged.

Two nodes are the same computation where they call the same operator on the same arguments (the
same nodes, equal constants) and the operator is pure:

* it has a schema, and the schema neither mutates an argument nor returns an alias of one;
* it is not random (`nondeterministic_seeded`);
* no argument is a tensor some op of the graph writes in place (a KV cache updated by
  `update_cache_`): two reads of it on either side of the write differ;
* the later node is not a program output (the graph signature names each output once);
* it is not a quantize / dequantize (`quantized_decomposed`): PT2E keeps one per consumer on
  purpose, and the XNNPACK partitioner needs them so;
* reading the earlier node does not give a control-flow op one tensor as two operands (nor do
  merged constants): torch cannot retrace such a program (fuzz seed 44, graph 2770);
* it is not a copy a compat pass inserted on purpose (`CondOutputCopyPass`, `CondViewCopyPass`:
  `meta["etfuse"]["copied"]`): they run after this pass, so merging such a copy with an earlier
  copy of the same result (export's, before a `while_loop`) only happened when a fused program was
  fused again, which then differed from fusing once (fuzz seed 44, graph 2085).

The later node's users then read the earlier one, which already comes first in the graph; in a
functional graph (before `to_executorch` makes cache updates in place) this only moves reads of
an old value earlier. Every graph module is visited, control-flow bodies too, each on its own.
It runs after the fusion pass: merging two identical views before it would give a view two
users and keep a rule that wants one from matching.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.fx as fx
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.passes.constant_prop_pass import get_constant_placeholder_dict
from torch.fx.passes.infra.pass_base import PassResult

from .fold_packed_weights import without_unused_constants
from .graph_copy import copy_graph_module, editable_copy, graph_modules, program_with


def _schema(node: fx.Node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _written(graph: fx.Graph) -> set:
    """The nodes whose tensors some op of `graph` writes in place."""
    written = set()
    for node in graph.nodes:
        schema = _schema(node)
        if schema is None or not schema.is_mutable:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                fx.node.map_arg(value, written.add)
    return written


def _pure(node: fx.Node) -> bool:
    schema = _schema(node)
    if schema is None or schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False
    if schema.name.startswith("quantized_decomposed::"):
        # PT2E gives each consumer its own dequantize (DuplicateDQPass) so that every quantized
        # op sees its own q/dq pattern; one shared dq made the XNNPACK partitioner join two
        # partitions through it and fail ("Invalid partition, found dependency cycles",
        # int8 MobileNetV2 on the passes_beside_xnnpack route)
        return False
    tags = getattr(node.target, "tags", ()) or ()
    return torch.Tag.nondeterministic_seeded not in tags


def _key(value):
    """A hashable stand-in for an argument: nodes by identity, lists as tuples, constants by type
    and value (so 1 and 1.0 and True differ); None where the value has none."""
    if isinstance(value, fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        items = tuple(_key(v) for v in value)
        return None if None in items else (type(value).__name__, items)
    if isinstance(value, dict):
        items = tuple((k, _key(v)) for k, v in sorted(value.items()))
        return None if any(v is None for _, v in items) else ("dict", items)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value).__name__, value)
    return None


def _node_key(node: fx.Node, written: set) -> Optional[tuple]:
    if not _pure(node) or any(user.op == "output" for user in node.users) or "copied" in node.meta.get("etfuse", {}):
        return None  # a program output stays its own node: the output list names each once
    reads: list = []
    fx.node.map_arg((node.args, node.kwargs), reads.append)
    if any(r in written for r in reads):
        return None
    args, kwargs = _key(node.args), _key(node.kwargs)
    return None if args is None or kwargs is None else (node.target, args, kwargs)


def _would_repeat_an_operand(node: fx.Node, into: fx.Node) -> bool:
    """Whether reading `into` in place of `node` gives a control-flow op (`cond`, `scan`, ...) one
    tensor as two operands: torch then cannot retrace the program ("cond_true might be aliasing
    the input or the output!"; fuzz seed 44 graph 2770: two branches' equal weight scales)."""
    for user in node.users:
        if user.op == "call_function" and isinstance(user.target, torch._ops.HigherOrderOperator):
            operands: list = []
            fx.node.map_arg((user.args, user.kwargs), operands.append)
            if into in operands:
                return True
    return False


def merge_common_subexpressions(graph: fx.Graph, find_only: bool = False) -> int:
    """Merge the repeated pure computations of `graph` in place; returns how many nodes went.
    `find_only`: change nothing, return 1 at the first repeat (there is one to merge) or 0."""
    written = _written(graph)
    first: dict = {}
    merged = 0
    for node in list(graph.nodes):
        key = _node_key(node, written)
        if key is None:
            continue
        try:
            earlier = first.setdefault(key, node)
        except TypeError:  # a constant that does not hash after all
            continue
        if earlier is not node and not _would_repeat_an_operand(node, earlier):
            if find_only:  # the first repeat merged sees the graph as given: it is this one
                return 1
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
            merged += 1
    return merged


def _same_constants(constants: dict, kinds: dict) -> dict:
    """placeholder -> the earlier placeholder holding the same values, for each repeated constant
    of the same kind (a parameter is not merged into a buffer: a batch norm's zero bias and zero
    running mean stay apart, the mean must not require grad). Candidates are grouped by dtype,
    shape and a sample of their elements, so unequal weights of one shape (a model's every layer)
    are told apart without comparing them whole."""
    groups: dict = {}
    for node, value in constants.items():
        flat = value.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 16)][:16]
        key = (kinds.get(node.name), value.requires_grad, value.dtype, tuple(value.shape), sample.tolist())
        groups.setdefault(str(key), []).append(node)
    same = {}
    for nodes in groups.values():
        firsts: list = []
        for node in nodes:
            match = next((f for f in firsts if torch.equal(constants[f], constants[node])), None)
            if match is None:
                firsts.append(node)
            else:
                same[node] = match
    return same


def _merge_constants(ep):
    """`ep` with repeated constants read from one placeholder, or None where none repeats."""
    constants = get_constant_placeholder_dict(ep)
    kinds = {spec.arg.name: spec.kind for spec in ep.graph_signature.input_specs}
    same = _same_constants(constants, kinds)
    if not same:
        return None
    new = editable_copy(ep)
    by_name = {n.name: n for n in new.graph.nodes if n.op == "placeholder"}
    dropped = set()
    for node, first in same.items():
        duplicate = by_name[node.name]
        if _would_repeat_an_operand(duplicate, by_name[first.name]):
            continue
        duplicate.replace_all_uses_with(by_name[first.name])
        dropped.add(duplicate)
    return without_unused_constants(new, dropped) if dropped else None


class CommonSubexpressionPass(ExportedProgramPassBase):
    """Repeated constants stored once, repeated pure computations run once (module docstring)."""

    def __call__(self, program):
        if isinstance(program, fx.GraphModule):
            result = copy_graph_module(program)
            return PassResult(result, _merge_ops(result))
        return super().__call__(program)

    def call(self, ep) -> ExportedProgramPassResult:
        merged = _merge_constants(ep)
        if merged is not None:  # a program of this pass's own: its ops are merged in place
            _merge_ops(merged.graph_module)
            return ExportedProgramPassResult(merged, True)
        if not any(merge_common_subexpressions(m.graph, find_only=True) for _, m in graph_modules(ep.graph_module)):
            return ExportedProgramPassResult(ep, False)  # no copy made for nothing
        gm = copy_graph_module(ep.graph_module)
        _merge_ops(gm)
        return ExportedProgramPassResult(program_with(ep, gm, copy.deepcopy(ep.graph_signature)), True)


def _merge_ops(graph_module: fx.GraphModule) -> bool:
    """Merge the repeated pure computations of `graph_module` and its bodies in place; whether any was."""
    changed = False
    for _, module in graph_modules(graph_module):
        if merge_common_subexpressions(module.graph):
            module.recompile()
            changed = True
    return changed
