"""Checks of a backend op's C++ `.out` kernel against its pattern, in torch eager and on the
ExecuTorch runtime (the `kernel_check` fixture of conftest.py hands this module out with the
kernels loaded).

The reference is always the op's pattern (`BackendOp.pattern`) run in eager on contiguous copies
of the inputs. Calling the functional op (`torch.ops.etfuse.mul(a, b)`) checks nothing about a
kernel: its kernel *is* the pattern (CompositeImplicitAutograd); only the `.out` variants have C++
kernels (libetfuse_eager.so in torch, libetfuse_runtime.so in the runtime).

* `eager(op, args)`: `op`'s `.out` on `args` as given (any strides), into `out` (default: an empty
  tensor the kernel resizes), equal to the pattern; the `.out` must be served by a C++ kernel.
* `layouts(op, args)`: `eager` on every layout of the inputs the kernel must read as torch does
  (`variants`: a transposed view, every other element of a wider tensor (`x[..., ::2]`),
  channels-last), on an `out` with transposed strides, and with `out` being each input of the
  output's shape and dtype (aliasing: computed as if into a fresh tensor).
* `runtime(op, cases)`: one `.pte` whose only ops are `op` (one node per case: its arguments as
  given, tensors as program inputs in their dim order, the rest constants), run on the runtime,
  each output equal to the pattern. The runtime takes contiguous and dim-order tensors only (a
  channels-last input is dim order (0, 2, 3, 1); `etfuse.runtime` copies anything else into the
  program's layout before the kernel sees it), so strided views and aliasing are eager's cases;
  broadcasting and channels-last are the runtime's.
* `check(op, args)`: `layouts`, then `runtime` on the contiguous and channels-last inputs.

Floating outputs compare with `tol` (default `FLOAT_TOL`), integer and quantized ones exactly.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

import torch
import torch.fx as fx

FLOAT_TOL = dict(rtol=1e-4, atol=1e-5)

Args = Sequence  # an op's positional arguments, as its schema orders them


# --------------------------------------------------------------------------------------------
# what serves the `.out` op


def out_qualname(op) -> str:
    return f"{op.namespace}::{op.out_name}"


def cpp_kernel(op) -> str:
    """Where torch's CPU kernel of `op`'s `.out` was registered (`ops/mul.cpp:14`); fails unless
    it is a C++ kernel of the eager library (not the Python reference kernel, which runs the
    pattern and would make every check below compare the pattern with itself)."""
    name = out_qualname(op)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), (
        f"{name} has no CPU kernel: the eager library is not loaded (etfuse.kernels.load(eager=True))")
    dump = torch._C._dispatch_dump(name)
    line = next((ln for ln in dump.splitlines() if ln.startswith("CPU:")), "")
    found = re.search(r"registered at (\S+?\.(?:cpp|h)):\d+", line)
    assert found, f"{name}'s CPU kernel is not a C++ kernel:\n{dump}"
    return found.group(0).split("csrc/", 1)[-1]


# --------------------------------------------------------------------------------------------
# inputs: the same values in other memory layouts


def transposed(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values, its last two dims stored the other way round (a transposed view)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def sliced(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values read as every other element of a tensor twice as wide (`x[..., ::2]`)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def variants(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """The layouts of `t` that differ from contiguous for its rank and sizes."""
    out = {}
    if t.dim() >= 2 and t.numel() > 1:
        out["transposed"] = transposed(t)
    if t.dim() >= 1 and t.numel() > 0:
        out["sliced"] = sliced(t)
    if t.dim() == 4 and t.numel() > 1 and not channels_last(t).is_contiguous():
        out["channels_last"] = channels_last(t)
    return out


def _tensor_positions(args: Args) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def _contiguous(args: Args) -> list:
    return [a.clone(memory_format=torch.contiguous_format) if isinstance(a, torch.Tensor) else a for a in args]


def _label(op, what: str) -> str:
    return f"{out_qualname(op)} ({what})" if what else out_qualname(op)


# --------------------------------------------------------------------------------------------
# comparing with the pattern


def expected(op, args: Args, kwargs: Optional[dict] = None) -> torch.Tensor:
    """The pattern's output on contiguous copies of `args`."""
    with torch.no_grad():
        return op.pattern(*_contiguous(args), **(kwargs or {}))


def assert_matches(got: torch.Tensor, want: torch.Tensor, tol: Optional[dict] = None, what: str = "") -> None:
    """Floating outputs within `tol` (NaNs where the pattern's are), others bit-equal."""
    if want.is_floating_point():
        torch.testing.assert_close(got, want, equal_nan=True, **(tol or FLOAT_TOL),
                                   msg=lambda m: f"{what}: {m}" if what else m)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{what}: {m}" if what else m)


def eager(op, args: Args, kwargs: Optional[dict] = None, *, out: Optional[torch.Tensor] = None,
          tol: Optional[dict] = None, what: str = "", want: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`op`'s C++ `.out` kernel on `args` (as given: strides, views, aliasing) into `out` (default:
    an empty tensor of the output's dtype, which the kernel resizes) against the pattern. Returns out."""
    cpp_kernel(op)
    want = expected(op, args, kwargs) if want is None else want
    out = torch.empty(0, dtype=want.dtype) if out is None else out
    with torch.no_grad():
        got = op.aten_out(*args, **(kwargs or {}), out=out)
    label = _label(op, what)
    assert got is out, f"{label}: returned another tensor than out"
    assert tuple(out.shape) == tuple(want.shape), f"{label}: out has shape {tuple(out.shape)}, the pattern {tuple(want.shape)}"
    assert_matches(out, want, tol, label)
    return out


def layouts(op, args: Args, kwargs: Optional[dict] = None, *, fixed: Iterable[int] = (),
            tol: Optional[dict] = None, strided_out: bool = True, alias: bool = True) -> None:
    """`eager` on `args`, then on each tensor input but those at the positions `fixed` (which the
    kernel takes contiguous only) in each of its `variants` (the others as given), then all of them
    transposed at once, into an out with transposed strides, and into each input of the output's
    shape and dtype (aliasing)."""
    want = expected(op, args, kwargs)
    eager(op, args, kwargs, tol=tol, want=want, what="contiguous")
    positions = [i for i in _tensor_positions(args) if i not in set(fixed)]
    for i in positions:
        for name, v in variants(args[i]).items():
            eager(op, [v if j == i else a for j, a in enumerate(args)], kwargs, tol=tol, want=want,
                  what=f"argument {i} ({op.arg_names[i]}) {name} {tuple(v.stride())}")
    many = [i for i in positions if args[i].dim() >= 2 and args[i].numel() > 1]
    if len(many) > 1:
        eager(op, [transposed(a) if j in many else a for j, a in enumerate(args)], kwargs, tol=tol, want=want,
              what=f"arguments {many} transposed")
    if strided_out and want.dim() >= 2 and want.numel() > 1:
        out = transposed(torch.empty(want.shape, dtype=want.dtype))
        eager(op, args, kwargs, out=out, tol=tol, want=want, what=f"out transposed {tuple(out.stride())}")
        assert out.stride() == transposed(want).stride(), f"{_label(op, 'out transposed')}: out's strides changed"
    if alias:
        for i in _tensor_positions(args):
            a = args[i]
            if a.shape == want.shape and a.dtype == want.dtype and i in positions:
                mine = _contiguous(args)
                eager(op, mine, kwargs, out=mine[i], tol=tol, want=want,
                      what=f"out is argument {i} ({op.arg_names[i]})")


# --------------------------------------------------------------------------------------------
# the ExecuTorch runtime


class _Inputs(torch.nn.Module):
    """A program taking `n` inputs and returning `outputs` values: the body is replaced by the op
    nodes (`one_op_program`); only the placeholders and the output count are kept."""

    def __init__(self, outputs: int):
        super().__init__()
        self.outputs = outputs

    def forward(self, *xs):
        return tuple(xs[0].clone() for _ in range(self.outputs))


def one_op_program(op, cases: Sequence[Args], kwargs: Optional[dict] = None):
    """An edge program whose only ops are `op` (`BackendOp.backend`), one node per case: a case's
    tensors are inputs of the program (in their dim order), its other arguments constants of the
    node, like `kwargs`. Returns (edge program, the inputs in order)."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from torch.fx.passes.infra.pass_base import PassResult

    # one tensor per input (export would make a tensor passed twice one input), in its layout
    inputs = [a.clone() for args in cases for a in args if isinstance(a, torch.Tensor)]
    if not inputs:
        raise ValueError(f"{op.qualname}: a one-op program needs a tensor argument")
    ep = torch.export.export(_Inputs(len(cases)), tuple(inputs))

    def only_op(gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        # the user inputs: the last placeholders (after any lifted constant)
        placeholders = iter([n for n in graph.nodes if n.op == "placeholder"][-len(inputs):])
        output = graph.output_node()
        nodes = []
        with graph.inserting_before(output):
            for args in cases:
                node_args = tuple(next(placeholders) if isinstance(a, torch.Tensor) else a for a in args)
                node = graph.call_function(op.backend, node_args, dict(kwargs or {}))
                node.meta["val"] = op.backend(*(a.meta["val"] if isinstance(a, fx.Node) else a for a in node_args),
                                              **(kwargs or {}))
                nodes.append(node)
        output.args = (tuple(nodes),)
        graph.eliminate_dead_code()
        gm.recompile()
        return PassResult(gm, True)

    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).transform([only_op])
    return edge, inputs


def runtime(op, cases: Sequence[Args], kwargs: Optional[dict] = None, *, tol: Optional[dict] = None) -> None:
    """`op`'s runtime kernel, one node per case of one `.pte`, against the pattern."""
    from etfuse.runtime import run

    from fusion_helpers import plan_ops

    edge, inputs = one_op_program(op, cases, kwargs)
    program = edge.to_executorch()
    assert plan_ops(program) == [out_qualname(op)], plan_ops(program)
    outputs = run(program, inputs)
    assert len(outputs) == len(cases)
    for k, (args, got) in enumerate(zip(cases, outputs)):
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        assert_matches(got, expected(op, args, kwargs), tol, f"{out_qualname(op)} on the runtime, case {k} {shapes}")


def channels_last_case(args: Args) -> Optional[list]:
    """`args` with every 4-D tensor channels-last, or None when none changes."""
    changed = [channels_last(a) if isinstance(a, torch.Tensor) and a.dim() == 4 and a.numel() > 1 and
               not channels_last(a).is_contiguous() else a for a in args]
    return None if all(c is a for c, a in zip(changed, args)) else changed


def check(op, args: Args, kwargs: Optional[dict] = None, *, fixed: Iterable[int] = (),
          tol: Optional[dict] = None, runtime_cases: Sequence[Args] = (), on_runtime: bool = True,
          **layout_options) -> None:
    """`layouts(op, args)` in eager, then `op` on the runtime on `args`, their channels-last form
    (4-D inputs) and `runtime_cases`."""
    layouts(op, args, kwargs, fixed=fixed, tol=tol, **layout_options)
    if on_runtime:
        cases = [list(args)]
        cl = channels_last_case(args)
        if cl is not None:
            cases.append(cl)
        runtime(op, [*cases, *runtime_cases], kwargs, tol=tol)


# --------------------------------------------------------------------------------------------
# element-wise binary ops: broadcasting

# (self, other) shapes: same shape, a row, a column, size-1 dims on both sides, rank mismatch,
# 0-d, a per-channel scale [N, C, 1, 1], empty; each is also checked with the operands swapped
BROADCAST_SHAPES = [
    ((4, 17), (4, 17)),
    ((4, 17), (17,)),
    ((4, 17), (4, 1)),
    ((4, 1, 5), (3, 1)),
    ((2, 3, 4), (1, 3, 1)),
    ((3, 1, 257), (1, 5, 1)),
    ((2, 8, 5, 7), (2, 8, 1, 1)),
    ((2, 8, 5, 7), (1, 8, 1, 1)),
    ((1, 300, 1), (7, 1, 1025)),  # the parallel path, chunks starting mid-row
    ((7,), ()),
    ((), ()),
    ((0, 3), (3,)),
]


def broadcast_pairs(shapes=BROADCAST_SHAPES, make=torch.randn, seed: int = 0):
    """(self, other) tensors for each pair of shapes, in both orders."""
    g = torch.Generator().manual_seed(seed)
    for sa, sb in shapes:
        a, b = make(sa, generator=g), make(sb, generator=g)
        yield a, b
        if sa != sb:
            yield b, a


def aliased_views(x: torch.Tensor):
    """Pairs of inputs sharing `x`'s storage: `(x, x[:1])`, `(x[:1], x)`, `(x, x)`, and a
    transposed view against `x` itself (when square in its last two dims)."""
    yield x, x[:1]
    yield x[:1], x
    yield x, x
    if x.dim() >= 2 and x.shape[-1] == x.shape[-2]:
        yield x, x.transpose(-1, -2)
