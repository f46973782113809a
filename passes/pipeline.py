"""The recommended pass list, `fuse` (the one-call entry point) and `to_edge`.

Three routes run the same passes and give the same program (tests/test_routes.py):

    etfuse.fuse(edge)                                                  # this module
    edge.transform(etfuse.passes.default_passes())                     # executorch's pass manager
    edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))

Every pass in `default_passes()` is an `ExportPass` that takes a graph module and returns a new
one, so each route works with what it is given. `fuse` adds what only the whole program allows:
it verifies only the nodes etfuse wrote (`verify.py`), raises etfuse's errors as themselves, and returns a program
whose `to_executorch()` leaves it intact (`fused_program.py`).
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Sequence, Union

import torch
import torch.fx as fx
from executorch.exir import EdgeCompileConfig, EdgeProgramManager
from executorch.exir.pass_base import ExportedProgramPassBase
from torch.export import ExportedProgram

from etfuse.backend_ops import install
from etfuse.patterns.rule import CONSTANT_VALUE

from .compat.cond_outputs import CondOutputCopyPass
from .compat.cond_views import CondViewCopyPass
from .compat.map_to_scan import MapToScanPass, SpecialisedShapeError
from .compat.symint_to_prims import SymIntToPrimsPass
from .compat.typed_pass_errors import install_typed_pass_errors
from .compat.while_loop_to_scan import LoopLoweringPass
from .common_subexpressions import CommonSubexpressionPass
from .drop_identity_copies import DropIdentityCopiesPass
from .unit_dim_views import UnitDimViewsPass
from .fold_packed_weights import FoldPackedWeightsPass
from .gated_linears import GatedLinearsPass
from .prepack_weights import PrepackWeightsPass
from .runtime_names import EmitRuntimeNamesPass
from .fused_program import FusedEdgeProgramManager
from .fusion_pass import BesideXnnpackFusionPass, FusionPass
from .graph_copy import copy_graph_module, graph_modules, has_hop, owned, program_with
from .verify import verify_written_nodes


def default_passes() -> list:
    """etfuse's passes in the order their inputs require.

    1. `LoopLoweringPass`: fusion must see loop bodies as scan bodies, which every later pass visits.
    2. `FusionPass`: every rule (quantized, GEMM/conv with their batch norm, float) in one sweep;
       which rule wins is the rules' data (`Rule.outranks`, passes/engine.py), not this order.
       `FoldPackedWeightsPass` then folds the sub-byte embeddings' weight packing into constants
       (it needs the program's values; given a graph module alone it leaves the packing to the runtime),
       `GatedLinearsPass` joins a gated MLP's two linears into one (SwiGLU), and
       `PrepackWeightsPass` packs the constant weights of multi-row linears into the GEMM's panels
       (`linear_packed_act`; given a graph module alone it changes nothing).
       `DropIdentityCopiesPass`, right after `FusionPass`, drops the copies nothing can tell from their
       source (eval-mode dropout's); after fusion, so the rules see the graph as export made it.
       `UnitDimViewsPass` makes static unsqueeze / squeeze copies, and permutes that move only unit
       dims, `view_copy`s, which `to_executorch` turns into views (conv1d's, around the conv2d
       kernel it runs on; a decoding step's head transposes).
       `CommonSubexpressionPass` then runs once what export traced once per layer (llama's mask);
       after `UnitDimViewsPass`, so copies that become equal views are merged too, and fusing a
       fused program again changes nothing.
    3. `CondOutputCopyPass`, `CondViewCopyPass`: they copy results read by the final ops, so they
       run once those ops exist.
    4. `SymIntToPrimsPass`: the builtins of every pass before it (loop bounds included) become prims.
    5. `EmitRuntimeNamesPass`: the quantized_decomposed ops etfuse has kernels for are called by their
       etfuse names, so the `.pte` runs beside executorch's stock quantized kernels. A lowering step:
       `fuse` leaves it out of the program it returns and runs it in that program's `to_executorch()`.
    """
    install_typed_pass_errors()  # so `edge.transform(default_passes())` raises etfuse's errors as themselves
    return [LoopLoweringPass(), FusionPass(), DropIdentityCopiesPass(), UnitDimViewsPass(), CommonSubexpressionPass(),
            FoldPackedWeightsPass(), GatedLinearsPass(), PrepackWeightsPass(), CondOutputCopyPass(), CondViewCopyPass(),
            SymIntToPrimsPass(), EmitRuntimeNamesPass()]


def passes_beside_xnnpack() -> list:
    """`default_passes()` with the fusion pass limited to what the XNNPACK delegate leaves to the
    portable runtime (`BesideXnnpackFusionPass`): for `etfuse.fuse(to_edge(ep), passes_beside_xnnpack())`
    then `.to_backend(XnnpackPartitioner())`. Fusing after lowering instead finds attention already
    split between the delegate (bmm, softmax) and the portable runtime."""
    install_typed_pass_errors()
    return [LoopLoweringPass(), BesideXnnpackFusionPass(), DropIdentityCopiesPass(), UnitDimViewsPass(),
            CommonSubexpressionPass(), FoldPackedWeightsPass(), GatedLinearsPass(), PrepackWeightsPass(), CondOutputCopyPass(), CondViewCopyPass(),
            SymIntToPrimsPass()]


def correctness_passes() -> list:
    """What an unfused program needs to compute the right thing on executorch 1.5.1 (loops it can
    run, the cond-result copies, symbolic builtins as prims): the stock baseline etfuse compares with."""
    return [LoopLoweringPass(), CondOutputCopyPass(), CondViewCopyPass(), SymIntToPrimsPass()]


def to_edge(program: ExportedProgram, compile_config=None, **kwargs) -> EdgeProgramManager:
    """`executorch.exir.to_edge` that keeps control flow dynamic and shape arithmetic exact.

    `map` becomes `scan` before lowering (`MapToScanPass`); lowering runs with the edge verifier
    off, because it rejects `torch.sym_max/sym_min/sym_not/sym_ite/sym_float` before any pass can
    rewrite them, then `SymIntToPrimsPass` makes symbolic builtins exact `executorch_prim` ops and
    the result is verified with `compile_config` (checks on by default). If lowering still
    specialised a `Dim` to a constant this raises `SpecialisedShapeError` naming it, rather than
    returning a program that computes wrong values at other sizes.
    """
    import dataclasses

    from executorch.exir import to_edge as executorch_to_edge

    before = {str(k): v for k, v in program.range_constraints.items()}
    if has_hop(program.graph_module, torch.ops.higher_order.map_impl):
        program = program._transform_do_not_use(MapToScanPass())
    config = compile_config or EdgeCompileConfig()
    edge = executorch_to_edge(program, compile_config=dataclasses.replace(config, _check_ir_validity=False), **kwargs)
    edge = edge.transform([SymIntToPrimsPass()], compile_config=config)
    after = {str(k) for k in edge.exported_program().range_constraints}
    lost = {k: v for k, v in before.items() if k not in after and (v.lower != v.upper)}
    if lost:
        raise SpecialisedShapeError(
            f"lowering specialised the dynamic dimension(s) {sorted(lost)} (ranges "
            f"{[str(v) for v in lost.values()]}) to the example size; the program would compute wrong values "
            "at other sizes. Something in the program guards on the size (a data-dependent branch, or a "
            "control-flow operator that executorch unrolls).")
    return edge


Program = Union[EdgeProgramManager, ExportedProgram]

# executorch's verifier and fake-tensor machinery keep process-wide state (side tables, shape
# environments) that concurrent passes corrupt (seen: "Node ... is not added to the side table"
# with 4 threads). One fuse at a time; other threads wait.
_FUSE_LOCK = threading.Lock()


def fuse(program: Program, passes: Optional[Sequence] = None, *, step_times: Optional[dict] = None) -> Program:
    """Fuse an `EdgeProgramManager` or an edge-dialect `ExportedProgram`; returns the same type.

    The caller's object is never modified and shares no graph module with the result. An error
    raised by an etfuse pass arrives as itself (`LoopLoweringError`, `FusionError`, ...); any
    error leaves the caller's program as it was. `step_times`, a dict, receives the seconds each
    step took (each pass by its class name, and fuse's own steps), summed over the programs:
    what `benchmarks/pass_scaling.py` reports.
    """
    clock = _Clock(step_times)
    install()
    # the emission names are the lowering's business (FusedEdgeProgramManager.to_executorch)
    passes = [p for p in default_passes() if not isinstance(p, EmitRuntimeNamesPass)] if passes is None else list(passes)
    if isinstance(program, ExportedProgram):
        if program.dialect != "EDGE":
            raise TypeError(
                f"etfuse.fuse takes an edge-dialect program, got a {program.dialect} ExportedProgram: "
                "lower it first with executorch.exir.to_edge(program)"
            )
        # Not through `EdgeProgramManager(program)`: its constructor re-runs executorch's verifier
        # over the whole program (every node on fake tensors, 3x the rest of fuse at 16,000 nodes), which
        # `to_edge` ran already; as for a manager, fuse verifies the nodes it writes.
        clock("setup (passes, manager)")
        with _FUSE_LOCK:
            return _run(program, passes, EdgeCompileConfig(), clock)
    if not isinstance(program, EdgeProgramManager):
        raise TypeError(
            f"etfuse.fuse takes an EdgeProgramManager or an edge ExportedProgram, got {type(program).__name__}"
        )
    clock("setup (passes, manager)")
    with _FUSE_LOCK:
        fused = {name: _run(ep, passes, program.compile_config, clock)
                 for name, ep in program._edge_programs.items()}
    result = FusedEdgeProgramManager.replacing_programs(program, fused)
    clock("result manager")
    return result


class _Clock:
    """`clock(step)` adds the seconds since its previous call (or its creation) to `times[step]`;
    does nothing when `times` is None."""

    def __init__(self, times: Optional[dict]):
        self.times = times
        self.last = time.perf_counter()

    def __call__(self, step: str) -> None:
        if self.times is not None:
            now = time.perf_counter()
            self.times[step] = self.times.get(step, 0.0) + now - self.last
            self.last = now


def _with_constant_values(ep: ExportedProgram) -> fx.GraphModule:
    """A copy of `ep`'s graph module whose constant inputs (weights, buffers, lifted constants)
    carry their value in `meta[CONSTANT_VALUE]` (a reference, not a copy), for passes that need
    what a graph module cannot give: a loop counter's `torch.tensor(0)`, a rule's check of weight
    values (`Match.constant`); `_run` removes them again."""
    gm = copy_graph_module(ep.graph_module)  # node meta dicts are the copy's own
    sig = ep.graph_signature
    for n in gm.graph.find_nodes(op="placeholder"):
        target = (sig.inputs_to_lifted_tensor_constants.get(n.name) or sig.inputs_to_parameters.get(n.name)
                  or sig.inputs_to_buffers.get(n.name))
        value = None if target is None else ep.constants.get(target, ep.state_dict.get(target))
        if isinstance(value, torch.Tensor):
            n.meta[CONSTANT_VALUE] = value
    return gm


def _run(ep: ExportedProgram, passes: list, compile_config, clock: Optional[_Clock] = None) -> ExportedProgram:
    """`passes` over one program: graph-module passes on the graph module (no program rebuilt or
    verified between them), `ExportedProgramPassBase` passes on a program; then constants folded
    and the nodes etfuse wrote verified. `clock` (`fuse`'s) times each step."""
    clock = clock or _Clock(None)
    gm = _with_constant_values(ep)
    clock("copy with constant values")
    for i, p in enumerate(passes):
        try:
            if isinstance(p, ExportedProgramPassBase):
                current = program_with(ep, gm) if gm is not ep.graph_module else ep
                ep = p(current).exported_program
                gm = ep.graph_module
            else:
                with owned(gm):  # a pass that changes nothing hands gm back instead of a copy
                    res = p(gm)
                if res is None:
                    raise TypeError(f"pass {p!r} returned None, not a PassResult")
                if res.modified:
                    gm = res.graph_module
        except Exception as e:
            e.add_note(f"(etfuse.fuse: in pass {i} of {len(passes)}, {p!r})")
            raise
        clock(type(p).__name__)
    for _, m in graph_modules(gm):
        for n in m.graph.find_nodes(op="placeholder"):
            n.meta.pop(CONSTANT_VALUE, None)
    out = program_with(ep, gm)
    clock("program construction")
    verify_written_nodes(out.graph_module, compile_config)
    clock("verify_written_nodes")
    return out
