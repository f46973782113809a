"""Random small models for property-based fuzzing of etfuse, and the four-way comparison.

ONE generator, two drivers: `generate(draw)` builds a `ModelSpec` from a `Draw` -- an object with
`int(lo, hi)` and `bool()` -- so the same code runs under hypothesis (`HypothesisDraw`, every
choice a shrinkable integer: a failure shrinks to fewer, simpler ops) and under a plain seeded
`random.Random` (`RandomDraw`, what `benchmarks/fuzz.py` uses for 10,000 graphs). Choice 0 is
always the simplest option (add, no bias, no batch norm, rank 2), so shrinking moves towards it.

A `ModelSpec` is a straight-line program over tensors of one "main" shape S plus broadcastable
side inputs (shapes like (F,), (1, F), (B, 1), ()); its `repr` is the program, readable as a
minimal model once hypothesis has shrunk it:

    ModelSpec(shape=(3, 8), quant=False, seed=0)
      v0 = input(3, 8)
      v1 = input(8,)
      v2 = add(v0, v1)
      v3 = relu(v2)
      return v3, v2

`check(spec)` runs it four ways -- eager, the fused program in torch eager, the unfused edge
program on the ExecuTorch runtime, the fused one on the runtime -- and classifies the outcome
(`Outcome.kind`): see `FAILURES` and `EXPECTED`. A model with `dynamic_batch` is exported with a
`torch.export.Dim` batch and run at several sizes inside its range; one model in `ROUTES_EVERY`
(`check_routes`) is also lowered by the other two routes (`edge.transform(default_passes())`: the
same `.pte` operator plan; `to_executorch(ExecutorchBackendConfig(passes=default_passes()))`: the
same numbers). Fusing the fused program again must change nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import traceback
from typing import Optional

import torch

# --- drawing ------------------------------------------------------------------------------------


class RandomDraw:
    """Choices from a seeded `random.Random` (the fuzz script)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def bool(self, p: float = 0.5) -> bool:
        return self.rng.random() < p


class HypothesisDraw:
    """Choices drawn from hypothesis (the test): each one an integer hypothesis can shrink."""

    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def bool(self, p: float = 0.5) -> bool:
        # shrinks towards 0, the False side (the simpler model)
        return self.draw(self.st.integers(0, 99)) >= 100 - round(p * 100)


def strategy(quant=None):
    """The hypothesis strategy of `ModelSpec`s (`quant=True`: PT2E int8 models only)."""
    from hypothesis import strategies as st

    @st.composite
    def specs(draw):
        return generate(HypothesisDraw(draw), quant)

    return specs()


# --- the model description -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    args: tuple = ()          # value indices (top level) or local names (inside a body)
    params: tuple = ()        # constants: (min, max), (scalar,), (bias, bn, ...)
    bodies: tuple = ()        # for cond / scan / while: tuples of Ops over locals "a", "b"

    def text(self, name) -> str:
        params = self.params
        if self.kind == "linear":
            params = [k for k, on in zip(("bias", "bn"), params) if on]
        elif self.kind == "conv":
            params = [f"k={params[0]}"] + [k for k, on in zip(("bias", "bn", "dw"), params[1:]) if on]
        elif self.kind == "while":
            params = [f"trips={params[0]}"]
        elif self.kind == "cond":
            params = []
        elif self.kind == "block":
            from fuzz_blocks import BLOCKS

            params = [BLOCKS[params[0]].describe(params[1:])]
        kind = self.kind if self.kind != "block" else self.params[0]
        if kind == "scalar":
            kind, params = f"{params[0]}_scalar", params[1:]
        args = [name(a) for a in self.args] + [_fmt(p) for p in params]
        if self.kind == "cond":
            args[0] = f"{args[0]}.sum() > 0"
        elif self.kind == "scan":
            args[:2] = [f"xs={args[0]}", f"init={args[1]}[0]"]
        s = f"{kind}({', '.join(args)}"
        for label, body in zip(_BODY_LABELS.get(self.kind, ()), self.bodies):
            s += f", {label}=[{'; '.join(_body_text(body))}]"
        return s + ")"


_BODY_LABELS = {"cond": ("then", "else"), "scan": ("step",), "while": ("body",)}


def _fmt(p):
    if isinstance(p, float):
        return f"{p:g}"
    if isinstance(p, str):
        return p
    return repr(p)


def _body_text(body) -> list:
    out = []
    for i, op in enumerate(body):
        out.append(f"t{i} = {op.text(lambda a: a if isinstance(a, str) else f't{a}')}")
    return out


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    shape: tuple                  # the main shape S: (B, F) or (B, C, H, W)
    inputs: tuple                 # shapes of the inputs (v0 = S, others broadcast against S)
    ops: tuple                    # Ops; values are numbered inputs first, then one per op
    outputs: tuple                # value indices returned
    quant: bool = False           # PT2E int8 (XNNPACK quantizer) over the whole model
    seed: int = 0                 # weights and inputs
    layout: str = ""              # input 0: "" contiguous, "channels_last" (rank 4), "transposed" (a strided view)
    dynamic_batch: tuple = ()     # (lo, hi): exported with dim 0 of S a torch.export.Dim in [lo, hi] (every
                                  # input whose dim 0 is S's batch), run at `batch_sizes()`; () static

    def __repr__(self):
        lay = f", layout={self.layout!r}" if self.layout else ""
        lay += f", dynamic_batch={self.dynamic_batch!r}" if self.dynamic_batch else ""
        lines = [f"ModelSpec(shape={self.shape}, quant={self.quant}, seed={self.seed}{lay})"]
        for i, s in enumerate(self.inputs):
            lines.append(f"  v{i} = input{tuple(s)}")
        n = len(self.inputs)
        for j, op in enumerate(self.ops):
            lines.append(f"  v{n + j} = {op.text(lambda a: f'v{a}')}")
        lines.append(f"  return {', '.join(f'v{o}' for o in self.outputs)}")
        return "\n".join(lines)

    @property
    def has_control_flow(self) -> bool:
        return any(op.kind in ("cond", "scan", "while") for op in self.ops)

    @property
    def has_while(self) -> bool:
        return any(op.kind == "while" for op in self.ops)

    def blocks(self) -> list:
        """(block name, params) of every block, in cond bodies too."""
        out = []
        for op in self.ops:
            for o in (op, *(b for body in op.bodies for b in body)):
                if o.kind == "block":
                    out.append((o.params[0], o.params[1:]))
        return out

    def code(self) -> str:
        """Python that rebuilds this spec (`ModelSpec(...)`, names from fuzz_models)."""
        return (f"ModelSpec(shape={self.shape!r}, inputs={self.inputs!r},\n    ops=({''.join(f'{op!r}, ' for op in self.ops)}),"
                f"\n    outputs={self.outputs!r}, quant={self.quant!r}, seed={self.seed!r}, layout={self.layout!r}"
                + (f", dynamic_batch={self.dynamic_batch!r}" if self.dynamic_batch else "") + ")")

    def batched(self, i: int) -> bool:
        """Input i has the (maybe dynamic) batch dim at 0: its rank is S's and its dim 0 S's batch."""
        s = self.inputs[i]
        return len(s) == len(self.shape) and len(s) > 0 and s[0] == self.shape[0] and self.shape[0] >= 2

    def batch_sizes(self) -> tuple:
        """The batch sizes `check` runs: S's, then (dynamic) the range's ends and one inside it."""
        if not self.dynamic_batch:
            return (self.shape[0],)
        lo, hi = self.dynamic_batch
        return tuple(dict.fromkeys((self.shape[0], lo, hi, (lo + hi + 1) // 2)))

    def dynamic_shapes(self):
        """`torch.export.export(dynamic_shapes=...)` for the inputs, or None."""
        if not self.dynamic_batch:
            return None
        lo, hi = self.dynamic_batch
        batch = torch.export.Dim("batch", min=lo, max=hi)
        # FuzzModel.forward(*inputs): one spec for the parameter `inputs`, a tuple
        return {"inputs": tuple({0: batch} if self.batched(i) else None for i in range(len(self.inputs)))}


# --- the generator -------------------------------------------------------------------------------

ELEMENTWISE = ("add", "sub", "mul", "relu", "hardtanh", "clamp", "scalar")
TOP_KINDS = ELEMENTWISE + ("linear", "conv", "cond", "scan", "while")
HARDTANH = ((-1.0, 1.0), (0.0, 6.0), (-0.5, 2.0))
CLAMP = ((0.0, None), (None, 1.0), (-1.0, 1.0), (0.0, 6.0))
SCALARS = (("add", 1.0), ("mul", 0.5), ("add", -0.25), ("mul", -2.0), ("sub", 0.5), ("rsub", 1.0))


def _broadcast_shapes(shape, draw) -> tuple:
    """A shape that broadcasts against the main shape `shape`."""
    if len(shape) == 2:
        b, f = shape
        options = [(f,), (1, f), (b, 1), (), (1, 1)]
    elif len(shape) == 3:
        b, t, f = shape
        options = [(f,), (1, 1, f), (t, 1), (), (b, 1, 1), (1, t, f)]
    else:
        b, c, h, w = shape
        options = [(c, 1, 1), (1, c, 1, 1), (w,), (), (b, 1, 1, 1), (1, 1, h, w)]
    return options[draw.int(0, len(options) - 1)]


def _bshape(a, b) -> tuple:
    return tuple(torch.broadcast_shapes(a, b))


def _broadcasts(s, shape) -> bool:
    """`s` broadcasts against the main shape without growing it (a usable operand)."""
    try:
        return _bshape(s, shape) == tuple(shape)
    except RuntimeError:
        return False


def _pick(draw, n: int, recent_bias: bool = True) -> int:
    """A value index in [0, n): mostly a recent one (chains), sometimes any (residuals)."""
    if recent_bias and draw.bool(0.6):
        return n - 1 - draw.int(0, min(1, n - 1))
    return draw.int(0, n - 1)


def _elementwise(draw, kind: str, pick, shapes) -> tuple[Op, tuple]:
    """One elementwise op; `pick()` gives an operand, `shapes[x]` its shape."""
    a = pick()
    if kind in ("add", "sub", "mul"):
        b = a if draw.bool(0.15) else pick()  # x + x
        return Op(kind, (a, b)), _bshape(shapes[a], shapes[b])
    if kind == "relu":
        return Op("relu", (a,)), shapes[a]
    if kind == "hardtanh":
        return Op("hardtanh", (a,), HARDTANH[draw.int(0, len(HARDTANH) - 1)]), shapes[a]
    if kind == "clamp":
        return Op("clamp", (a,), CLAMP[draw.int(0, len(CLAMP) - 1)]), shapes[a]
    if kind == "scalar":
        return Op("scalar", (a,), SCALARS[draw.int(0, len(SCALARS) - 1)]), shapes[a]
    raise AssertionError(kind)


def _blocks_for(shape, quant: bool) -> list:
    from fuzz_blocks import BLOCKS

    return [b for b in BLOCKS.values() if b.accepts(shape) and (b.quant_ok or not quant)]


def draw_block(draw, shape, quant: bool = False, usable_only: bool = False):
    """(Op params (name, *params), result shape) of a block drawn for main shape `shape`, or None."""
    from fuzz_blocks import BLOCKS

    names = [b.name for b in _blocks_for(shape, quant)]
    if not names:
        return None
    block = BLOCKS[names[draw.int(0, len(names) - 1)]]
    params = block.draw(draw, shape, quant)
    out = tuple(block.out_shape(params, shape))
    if usable_only and out != tuple(shape):
        return None
    return (block.name, *params), out


def _body(draw, shapes: dict, out_shape: tuple, max_ops: int = 3, block_shape=None) -> tuple:
    """A body over locals "a" and "b" (shapes given) whose result has shape `out_shape`; with
    `block_shape` (the main shape), maybe a building block on "a" first (a cond around a block)."""
    ops, names = [], list(shapes)
    shapes = dict(shapes)
    if block_shape is not None and tuple(shapes["a"]) == tuple(block_shape) and draw.bool(0.5):
        drawn = draw_block(draw, block_shape, usable_only=True)
        if drawn is not None:
            ops.append(Op("block", ("a",), drawn[0]))
            shapes[0] = drawn[1]
            names.append(0)
    for i in range(len(ops), len(ops) + draw.int(1, max_ops)):
        kind = ELEMENTWISE[draw.int(0, len(ELEMENTWISE) - 1)]
        op, shape = _elementwise(draw, kind, lambda: names[_pick(draw, len(names))], shapes)
        ops.append(op)
        shapes[i] = shape
        names.append(i)
    if shapes[len(ops) - 1] != tuple(out_shape):  # make the result the carried/branch shape
        ops.append(Op("add", (len(ops) - 1, "a")))
    return tuple(ops)


# "block" drawn about as often as all the elementwise kinds together
DRAWN_KINDS = TOP_KINDS + ("block",) * 6
QUANT_KINDS = TOP_KINDS[:9] + ("block",) * 3  # PT2E models: no control flow, blocks the quantizer takes


def _main_shape(draw) -> tuple:
    rank = (2, 4, 3)[draw.int(0, 2)]
    if rank == 4:
        return (draw.int(1, 2), draw.int(1, 4), draw.int(3, 5), draw.int(3, 5))
    if rank == 3:
        return (draw.int(1, 2), draw.int(1, 4), draw.int(1, 6))
    return (draw.int(1, 4), draw.int(1, 8))


def generate(draw, quant=None) -> ModelSpec:
    """A random model; `quant` forces the int8 choice (the draw is still made, so the rest of
    the choices are the same)."""
    drawn = draw.bool(0.15)
    quant = drawn if quant is None else quant
    shape = _main_shape(draw)
    rank4 = len(shape) == 4
    inputs = [shape] + [_broadcast_shapes(shape, draw) if draw.bool(0.7) else shape
                        for _ in range(draw.int(0, 2))]
    layout = ("", "channels_last" if rank4 else "transposed")[draw.int(0, 1) if draw.bool(0.15) else 0]
    if layout == "transposed" and shape[-1] == 1:
        layout = ""
    shapes = list(inputs)
    full = lambda i: tuple(shapes[i]) == tuple(shape)  # noqa: E731
    ops, sinks = [], []
    kinds = QUANT_KINDS if quant else DRAWN_KINDS
    for _ in range(draw.int(1, 7)):
        n = len(shapes)
        usable = [i for i in range(n) if _broadcasts(shapes[i], shape)]
        kind = kinds[draw.int(0, len(kinds) - 1)]
        fulls = [i for i in range(n) if full(i)]
        if kind in ELEMENTWISE:
            op, s = _elementwise(draw, kind, lambda: usable[_pick(draw, len(usable))], shapes)
        elif kind == "linear":
            cands = [i for i in usable if len(shapes[i]) >= 1 and shapes[i][-1] == shape[-1]]
            a = cands[-1 - draw.int(0, min(1, len(cands) - 1))] if draw.bool(0.7) else cands[draw.int(0, len(cands) - 1)]
            bn = len(shape) == 2 and full(a) and draw.bool(0.25)
            op, s = Op("linear", (a,), (draw.bool(0.6), "bn" if bn else "")), shapes[a]
        elif kind == "conv":
            if not rank4:
                continue
            a = fulls[-1] if draw.bool(0.7) else fulls[draw.int(0, len(fulls) - 1)]
            k = (1, 3)[draw.int(0, 1)]
            groups = "dw" if shape[1] > 1 and draw.bool(0.3) else ""
            op, s = Op("conv", (a,), (k, draw.bool(0.6), "bn" if draw.bool(0.4) else "", groups)), shape
        elif kind == "block":
            a = fulls[-1] if draw.bool(0.7) else fulls[draw.int(0, len(fulls) - 1)]
            got = draw_block(draw, shape, quant)
            if got is None:
                continue
            op, s = Op("block", (a,), got[0]), got[1]
        elif kind == "cond":
            a = fulls[-1] if draw.bool(0.6) else fulls[draw.int(0, len(fulls) - 1)]
            b, p = usable[_pick(draw, len(usable))], usable[_pick(draw, len(usable), recent_bias=False)]
            local = {"a": shape, "b": shapes[b]}
            op = Op("cond", (p, a, b), (), (_body(draw, local, shape, block_shape=shape),
                                            _body(draw, local, shape, block_shape=shape)))
            s = shape
        elif kind == "scan":
            a = fulls[-1] if draw.bool(0.6) else fulls[draw.int(0, len(fulls) - 1)]
            init = fulls[draw.int(0, len(fulls) - 1)]
            take = ("ys", "h")[draw.int(0, 1)]
            local = {"a": shape[1:], "b": shape[1:]}  # a: the carry h, b: the slice x
            op = Op("scan", (a, init), (take,), (_body(draw, local, shape[1:], block_shape=shape[1:]),))
            s = shape if take == "ys" else shape[1:]
        else:  # while: for i < trips: a = body(a, b)
            a = fulls[-1] if draw.bool(0.6) else fulls[draw.int(0, len(fulls) - 1)]
            b = usable[_pick(draw, len(usable))]
            local = {"a": shape, "b": shapes[b]}
            op = Op("while", (a, b), (draw.int(1, 3),), (_body(draw, local, shape, block_shape=shape),))
            s = shape
        ops.append(op)
        shapes.append(s)
        if not _broadcasts(s, shape):
            sinks.append(len(shapes) - 1)
            continue
        if kind in ("add", "sub", "linear", "conv") and draw.bool(0.5):
            # an activation right after: the chains the fusions look for (add_relu, linear_act,
            # conv2d_act, quantized add_relu)
            act = ("relu", "hardtanh", "clamp")[draw.int(0, 2)]
            op, s = _elementwise(draw, act, lambda: len(shapes) - 1, shapes)
            ops.append(op)
            shapes.append(s)
    usable = [i for i in range(len(shapes)) if _broadcasts(shapes[i], shape)]
    if not [i for i in usable if i >= len(inputs)]:
        ops.append(Op("relu", (0,)))
        shapes.append(shape)
        usable.append(len(shapes) - 1)
    last = usable[-1]
    outputs = [last]
    if draw.bool(0.4):  # an intermediate with a user outside a would-be fusion
        extra = draw.int(len(inputs), len(shapes) - 1)
        if extra != last:
            outputs.append(extra)
    outputs += [k for k in sinks if k not in outputs]
    spec = ModelSpec(tuple(shape), tuple(tuple(s) for s in inputs), tuple(ops), tuple(outputs), quant,
                     draw.int(0, 3), layout)
    # drawn last: the rest of a seed's model does not depend on it
    if draw.bool(0.4) and dynamic_ok(spec):
        spec = dataclasses.replace(spec, dynamic_batch=(2, shape[0] + 1 + draw.int(0, 4)))
    return spec


def dynamic_ok(spec: ModelSpec) -> bool:
    """The model may be exported with a dynamic batch: float, S's batch >= 2 (export specialises a
    size-1 dim), only blocks that allow it (`Block.dynamic_ok`), no scan and no while_loop: stock
    executorch's scan (and LoopLoweringPass lowers while_loop to one) copies a carry whose size
    depends on the Dim into a buffer it never resizes (op_copy: "tensor_is_broadcastable_to"),
    which fails at every batch but the Dim's max, fused or not."""
    from fuzz_blocks import BLOCKS

    return (not spec.quant and spec.shape[0] >= 2 and not any(op.kind in ("scan", "while") for op in spec.ops)
            and all(BLOCKS[name].dynamic_ok for name, _ in spec.blocks()))


# --- building the nn.Module ----------------------------------------------------------------------

def _apply_elementwise(op: Op, env):
    x = [env[a] for a in op.args]
    if op.kind == "add":
        return x[0] + x[1]
    if op.kind == "sub":
        return x[0] - x[1]
    if op.kind == "mul":
        return x[0] * x[1]
    if op.kind == "relu":
        return torch.relu(x[0])
    if op.kind == "hardtanh":
        return torch.nn.functional.hardtanh(x[0], *op.params)
    if op.kind == "clamp":
        return torch.clamp(x[0], *op.params)
    if op.kind == "scalar":
        how, c = op.params
        return {"add": lambda t: t + c, "mul": lambda t: t * c, "sub": lambda t: t - c,
                "rsub": lambda t: c - t}[how](x[0])
    raise AssertionError(op.kind)


def _run_body(body, a, b, blocks=None):
    """`blocks`: {body op index: module} (looked up outside: torch.cond traces this in eager too)."""
    env = {"a": a, "b": b}
    for i, op in enumerate(body):
        if op.kind == "block":
            env[i] = blocks[i](env[op.args[0]])
        else:
            env[i] = _apply_elementwise(op, env)
    return env[len(body) - 1]


class FuzzModel(torch.nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        g = torch.Generator().manual_seed(spec.seed)
        self.layers = torch.nn.ModuleDict()
        self.blocks = torch.nn.ModuleDict()
        for j, op in enumerate(spec.ops):
            if op.kind == "linear":
                f = spec.shape[-1]
                layer = torch.nn.Linear(f, f, bias=op.params[0])
                if op.params[1]:
                    layer = torch.nn.Sequential(layer, torch.nn.BatchNorm1d(f))
            elif op.kind == "conv":
                c = spec.shape[1]
                k, bias, bn, groups = op.params
                layer = torch.nn.Conv2d(c, c, k, padding=k // 2, bias=bias, groups=c if groups else 1)
                if bn:
                    layer = torch.nn.Sequential(layer, torch.nn.BatchNorm2d(c))
            else:
                for bi, body in enumerate(op.bodies):
                    for i, bop in enumerate(body):
                        if bop.kind == "block":
                            # a scan body runs on one slice: S without its first dim
                            local = spec.shape[1:] if op.kind == "scan" else spec.shape
                            self.blocks[f"{j}_{bi}_{i}"] = _build_block(bop, local, g)
                if op.kind == "block":
                    self.blocks[str(j)] = _build_block(op, spec.shape, g)
                continue
            for p in layer.parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            for m in layer.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            self.layers[str(j)] = layer
        self.eval()

    def _body_blocks(self, j: int) -> list:
        """For each body of op j: {body op index: its block's module}."""
        return [{i: self.blocks[f"{j}_{bi}_{i}"] for i, o in enumerate(body) if o.kind == "block"}
                for bi, body in enumerate(self.spec.ops[j].bodies)]

    def forward(self, *inputs):
        spec = self.spec
        env = dict(enumerate(inputs))
        n = len(inputs)
        for j, op in enumerate(spec.ops):
            if op.kind in ELEMENTWISE:
                r = _apply_elementwise(op, env)
            elif op.kind in ("linear", "conv"):
                r = self.layers[str(j)](env[op.args[0]])
            elif op.kind == "block":
                r = self.blocks[str(j)](env[op.args[0]])
            elif op.kind == "cond":
                p, a, b = (env[i] for i in op.args)
                then, other = op.bodies
                m0, m1 = self._body_blocks(j)
                r = torch.cond(p.sum() > 0, lambda a, b: _run_body(then, a, b, m0),
                               lambda a, b: _run_body(other, a, b, m1), (a, b))
            elif op.kind == "scan":
                from torch._higher_order_ops.scan import scan

                xs, init = env[op.args[0]], env[op.args[1]][0].clone()
                (body,) = op.bodies
                mods = self._body_blocks(j)[0]

                def step(h, x, body=body, mods=mods):
                    nh = _run_body(body, h, x, mods)
                    return nh, nh.clone()

                h, ys = scan(step, init, xs)
                r = ys if op.params[0] == "ys" else h
            elif op.kind == "while":
                from torch._higher_order_ops.while_loop import while_loop

                a, b = env[op.args[0]], env[op.args[1]]
                (body,) = op.bodies
                trips = op.params[0]
                mods = self._body_blocks(j)[0]
                r = while_loop(lambda i, acc: i < trips,
                               lambda i, acc, body=body, mods=mods: (i + 1, _run_body(body, acc, b, mods)),
                               (torch.zeros((), dtype=torch.int64), a.clone()))[1]
            else:
                raise AssertionError(op.kind)
            env[n + j] = r
        return tuple(env[o] for o in spec.outputs)


def _build_block(op: Op, shape, g) -> torch.nn.Module:
    from fuzz_blocks import BLOCKS

    return BLOCKS[op.params[0]].build(op.params[1:], shape, g)


def example_inputs(spec: ModelSpec, which: int = 0, batch: Optional[int] = None) -> tuple:
    """Input set `which`; `batch`: the batched inputs' dim 0 (a dynamic batch), S's by default."""
    g = torch.Generator().manual_seed(1000 * spec.seed + which)
    shapes = [s if batch is None or not spec.batched(i) else (batch, *s[1:]) for i, s in enumerate(spec.inputs)]
    xs = [torch.randn(s, generator=g) for s in shapes]
    if spec.layout == "channels_last" and xs[0].dim() == 4:
        xs[0] = xs[0].contiguous(memory_format=torch.channels_last)
    elif spec.layout == "transposed" and xs[0].dim() >= 2:
        xs[0] = xs[0].transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, strided
    return tuple(xs)


# --- lowering and the four-way check -------------------------------------------------------------

# Outcome kinds. FAILURES are etfuse's; EXPECTED are counted, not failures.
PASS = "pass"
ETFUSE_MISMATCH = "etfuse_mismatch"      # fused (eager or runtime) differs while the unfused runtime matches
ETFUSE_ERROR = "etfuse_error"            # etfuse.fuse, or lowering/running the fused program, raised
ETFUSE_UNSTABLE = "etfuse_unstable"      # fusing the fused program again changes its ops
ETFUSE_ROUTES = "etfuse_routes"          # the three routes differ where they promise not to (`check_routes`)
ETFUSE_AARCH64 = "etfuse_aarch64"        # the fused .pte on the aarch64 C++ runner (qemu) differs from x86's
STOCK_BUG = "stock_bug"                  # the unfused runtime is wrong (stock executorch); the fused one
                                         # right, or wrong with the same values (a stock kernel it kept)
STOCK_ERROR = "stock_error"              # the unfused program does not lower/run on the stock runtime
SKIP = "skip"                            # export / to_edge / quantization unsupported
KNOWN_ETFUSE_BUG = "known_etfuse_bug"    # an etfuse failure listed in KNOWN_ETFUSE_BUGS
FAILURES = (ETFUSE_MISMATCH, ETFUSE_ERROR, ETFUSE_UNSTABLE, ETFUSE_ROUTES, ETFUSE_AARCH64)
EXPECTED = (PASS, STOCK_BUG, STOCK_ERROR, SKIP, KNOWN_ETFUSE_BUG)


@dataclasses.dataclass
class Outcome:
    kind: str
    detail: str = ""
    error: str = ""   # "ExceptionType: first line" for errors, the grouping key
    fused_ok: Optional[bool] = None  # for stock bugs: whether the fused runtime matched eager
    fused_ops: dict = dataclasses.field(default_factory=dict)  # backend op -> count in the fused program
    rules: dict = dataclasses.field(default_factory=dict)  # rule key -> times it fired (FusionPass.report)
    passes: list = dataclasses.field(default_factory=list)  # passes that changed the graph
    int8_exact: Optional[bool] = None  # int8: the fused runtime equal, bit for bit, to the stock one
    aarch64: bool = False  # the fused .pte also ran on the aarch64 runner (and matched)

    def __str__(self):
        return f"{self.kind}: {self.detail}"


def _err(e: BaseException) -> str:
    """`Type: first line` of the innermost cause (executorch wraps pass errors in a generic one)."""
    seen = set()
    while (e.__cause__ or e.__context__) is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:160] if msg else ''}"


# etfuse bugs found by this fuzzer and reported, not yet fixed: (substring of `Outcome.error`,
# what it is). They are counted as KNOWN_ETFUSE_BUG instead of failing the test; delete an entry
# when its fix lands and the fuzz test will hold the fix.
KNOWN_ETFUSE_BUGS: list[tuple[str, str]] = [
    # ("Missing out variants: {'quantized_decomposed::dequantize_per_channel_group'}", ...) was here: the
    # config route left an 8-bit group embedding with int8 zero points unfused (q - zp may wrap in int8
    # for zero points it cannot see); fixed by embedding_byte_group_int8_zp (etfuse::embedding_byte_int8_zp
    # wraps as the pattern does), see tests/test_fuzz.py::test_the_config_route_lowers_an_8bit_group_embedding_with_zero_zero_points
    # and tests/test_embeddings.py::test_int8_zero_points_near_the_ends_on_every_route.
    # ("outs_to_grad length", ...) was here: LoopLoweringPass and FusedEdgeProgramManager.to_executorch
    # retraced loops with grad enabled; fixed (both run under torch.no_grad()), see
    # tests/test_contract.py::test_loop_whose_carry_depends_on_a_parameter.
]


def _known(outcome: "Outcome") -> "Outcome":
    if outcome.kind in FAILURES:
        for needle, what in KNOWN_ETFUSE_BUGS:
            if needle in outcome.error or needle in outcome.detail:
                return Outcome(KNOWN_ETFUSE_BUG, f"{what}\n{outcome.detail}", outcome.error)
    return outcome


def _pt2e_int8(model, args):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    m = torch.export.export(model, args).module()
    # per-channel weights, as XNNPACK users quantize (the quantized conv / linear rules take those)
    m = prepare_pt2e(m, XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    for k in range(3):
        m(*example_inputs(model.spec, 10 + k))
    m(*args)
    return convert_pt2e(m)


def _quant_step(ep) -> float:
    """The largest dequantize scale in the program: one quantization step of its coarsest tensor."""
    step = 0.0
    for n in ep.graph.nodes:
        if n.op == "call_function" and "dequantize_per_tensor" in str(n.target):
            s = n.args[1]
            if isinstance(s, float):
                step = max(step, s)
    return step


def _compare(got, want, atol, rtol) -> Optional[str]:
    """None when equal within tolerance, else a short description."""
    got, want = list(got), list(want)
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor):
            return f"output {i} is {type(g).__name__}"
        if tuple(g.shape) != tuple(w.shape):
            return f"output {i} shape {tuple(g.shape)}, want {tuple(w.shape)}"
        if w.dtype in (torch.float16, torch.bfloat16):  # half outputs: their own rounding step
            atol, rtol = max(atol, 1e-2), max(rtol, 1e-2)
        g, w = g.double(), w.double()
        finite = torch.isfinite(w)
        scale = max(1.0, w[finite].abs().max().item()) if finite.any() else 1.0
        bad = ~((g - w).abs() <= atol * scale + rtol * w.abs()) & ~(torch.isnan(g) & torch.isnan(w)) & ~(g == w)
        if bad.any():
            k = int(bad.flatten().nonzero()[0])
            return (f"output {i}: {int(bad.sum())}/{bad.numel()} differ, max abs diff "
                    f"{(g - w).abs()[bad].max().item():.3g}, e.g. [{k}] got {g.flatten()[k].item():.6g} "
                    f"want {w.flatten()[k].item():.6g}")
    return None


_KERNELS = None


def kernels():
    """`etfuse.kernels.load()`, once per process."""
    global _KERNELS
    if _KERNELS is None:
        import etfuse.kernels

        _KERNELS = etfuse.kernels.load()
    return _KERNELS


def check(spec: ModelSpec, runs: int = 2, routes: Optional[bool] = None, aarch64: Optional[list] = None) -> Outcome:
    """Eager vs fused eager vs unfused runtime vs fused runtime, on `runs` input sets (and the other
    sizes of a dynamic batch); the three routes too when `routes` (default: `check_routes(spec)`);
    with `aarch64` (the command that runs the C++ runner for aarch64, e.g. under qemu-aarch64) the
    fused .pte there too, on the first input set, against the x86 fused runtime."""
    return _known(_check(spec, runs, check_routes(spec) if routes is None else routes, aarch64))


def run_aarch64(runner: list, pte: bytes, inputs, like: list):
    """`pte` through the C++ runner command `runner` once: its outputs, read back like the tensors
    in `like`, or a string saying why there are none."""
    import subprocess
    import tempfile
    from pathlib import Path

    from deploy_models import read_outputs

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "model.pte").write_bytes(pte)
        args = []
        for i, t in enumerate(inputs):
            (d / f"input_{i}.bin").write_bytes(t.contiguous().numpy().tobytes())
            args += ["--input", str(d / f"input_{i}.bin")]
        (d / "out").mkdir()
        cmd = [*runner, str(d / "model.pte"), *args, "--output-dir", str(d / "out"), "--iterations", "1",
               "--warmup", "0", "--threads", "1"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return "the runner took over 600 s"
        if proc.returncode != 0:
            return f"the runner exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
        if (d / "out" / f"output_{len(like)}.bin").exists():
            return f"the runner wrote more than the {len(like)} outputs"
        try:
            return read_outputs(d / "out", like)
        except (AssertionError, FileNotFoundError) as e:
            return f"the runner's outputs: {e}"


def aarch64_checkable(spec: ModelSpec, inputs) -> bool:
    """The runner reads each input as contiguous bytes at the program's own sizes: no dynamic
    dims, no channels-last or strided inputs."""
    return spec.dynamic_shapes() is None and all(t.is_contiguous() for t in inputs)


ROUTES_EVERY = 4


def check_routes(spec: ModelSpec) -> bool:
    """Whether `check` compares the three routes for this model: one model in `ROUTES_EVERY`, chosen by
    a hash of its program (the same in every process), since they cost two more lowerings. The
    routes promise (docs/usage.md, tests/test_routes.py): `edge.transform(default_passes())` gives
    `etfuse.fuse(edge)`'s program, so the same `.pte` operator plan; `edge.to_executorch(
    ExecutorchBackendConfig(passes=default_passes()))` hands the passes no values (no prepacking,
    no gated-linear join, no folded packing), so only the same numbers."""
    import zlib

    return zlib.crc32(repr(spec).encode()) % ROUTES_EVERY == 0


_FUSED_NAMES = ("etfuse.", "quantized_decomposed.add", "quantized_decomposed.embedding_byte")


def fused_ops(program) -> dict:
    """Backend ops in a fused program, nested bodies included: {"etfuse.add_relu": 2, ...}."""
    counts = {}
    for gm in program.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for n in gm.graph.nodes:
            if n.op == "call_function":
                name = str(getattr(n.target, "_op", n.target))
                if name.startswith(_FUSED_NAMES):
                    key = name.rsplit(".", 1)[0] if name.endswith(".default") else name
                    counts[key] = counts.get(key, 0) + 1
    return counts


def _graph_signature(gm) -> list:
    """What a pass may change: every node's op and target, in every (nested) graph."""
    return [(path, n.op, str(n.target), len(n.args)) for path, m in gm.named_modules()
            if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes]


def instrumented_passes(changed: set, passes=None) -> list:
    """`default_passes()` (less EmitRuntimeNamesPass, as `etfuse.fuse` runs them), each one
    recording its class name in `changed` when its output graph differs from its input's."""
    from executorch.exir.pass_base import ExportedProgramPassBase
    from etfuse.passes import EmitRuntimeNamesPass, default_passes

    if passes is None:
        passes = [p for p in default_passes() if not isinstance(p, EmitRuntimeNamesPass)]
    for p in passes:
        cls = type(p)

        def call(self, arg, _cls=cls):
            before = _graph_signature(arg.graph_module if isinstance(self, ExportedProgramPassBase) else arg)
            res = _cls.__call__(self, arg)
            gm = res.exported_program.graph_module if isinstance(self, ExportedProgramPassBase) else res.graph_module
            if _graph_signature(gm) != before:
                changed.add(_cls.__name__)
            return res

        p.__class__ = type(cls.__name__, (cls,), {"__call__": call})
    return passes


def rule_keys(report) -> dict:
    """{rule key: count} of a `FusionReport` (keys are unique where names are not: the float and
    the quantized add_relu)."""
    from etfuse.patterns import RULES

    by_name = {}
    for r in RULES:
        by_name.setdefault(r.name, []).append(r.key)
    out = {}
    for f in report.fused:
        keys = by_name.get(f.rule, [f.rule])
        if len(keys) > 1:
            quantized = any("quantize" in n for n in f.replaced)
            keys = [k for k in keys if k.startswith("quantized_decomposed::") == quantized] or keys
        out[keys[0]] = out.get(keys[0], 0) + 1
    return out


def fuse_instrumented(edge):
    """`etfuse.fuse(edge)` with the fusion report and the passes that changed the graph:
    (fused, {rule key: count}, set of pass class names). EmitRuntimeNamesPass (a lowering step
    `to_executorch` runs) is run on a copy of the result to see whether it renames anything."""
    import etfuse
    from etfuse.passes import EmitRuntimeNamesPass, FusionPass

    changed = set()
    passes = instrumented_passes(changed)
    fused = etfuse.fuse(edge, passes)
    rules = {}
    for p in passes:
        if isinstance(p, FusionPass):
            for k, v in rule_keys(p.report).items():
                rules[k] = rules.get(k, 0) + v
    gm = fused.exported_program().graph_module
    names = instrumented_passes(changed, [EmitRuntimeNamesPass()])
    names[0](copy.deepcopy(gm))
    return fused, rules, changed


def plan_ops(program) -> list:
    """The operator table of a lowered program's first execution plan (tests/fusion_helpers.py's)."""
    return [f"{o.name}.{o.overload}" for o in program.executorch_program.execution_plan[0].operators]


def functional_plan(plan: list) -> list:
    """A plan's operators, sorted, with etfuse's in-place forms named by their functional `.out`
    ops: `FusedEdgeProgramManager.to_executorch` (the fuse route) runs a KV-cache write in place
    (passes/inplace_updates.py), `edge.transform(...).to_executorch()` runs the same program
    without that lowering step."""
    from etfuse.passes.inplace_updates import inplace_overrides

    names = {f"{op._schema.name}.": f"{op._schema.name[:-1]}.out" for op in inplace_overrides().values()}
    return sorted({names.get(o, o) for o in plan})


def op_list(program) -> list:
    """The call_function targets of a program, nested bodies included, in graph order."""
    return [str(getattr(n.target, "_op", n.target)) for gm in program.graph_module.modules()
            if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes if n.op == "call_function"]


def runtime_inputs(inputs) -> tuple:
    """`inputs` as the runtime takes them: contiguous or channels-last tensors as they are, a
    strided view as a contiguous copy."""
    return tuple(t if t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last) else t.contiguous()
                 for t in inputs)


def wrong_outputs(got: list, want: list, atol: float, rtol: float) -> list:
    """The indices of the outputs of `got` that differ from `want` beyond the tolerance."""
    return [i for i, (g, w) in enumerate(zip(got, want)) if _compare([g], [w], atol, rtol)]


def _stock_outputs(spec: ModelSpec, outputs: list, inputs: tuple):
    """The stock (unfused) program of `spec` returning only its `outputs` (indices), run on
    `inputs`: its outputs, or a string saying why there are none."""
    import etfuse
    from executorch.exir import to_edge
    from etfuse.passes import LoopLoweringPass
    from etfuse.runtime import load_method

    alone = dataclasses.replace(spec, outputs=tuple(spec.outputs[i] for i in outputs))
    try:
        torch.manual_seed(alone.seed)
        with torch.no_grad():
            edge = to_edge(torch.export.export(FuzzModel(alone), example_inputs(alone),
                                               dynamic_shapes=alone.dynamic_shapes()))
        if alone.has_while:
            edge = etfuse.fuse(edge, [LoopLoweringPass()])
        return list(load_method(edge.to_executorch()).execute(inputs))
    except Exception as e:  # noqa: BLE001
        return _err(e)


def _check(spec: ModelSpec, runs: int, routes: bool = False, aarch64: Optional[list] = None) -> Outcome:
    import etfuse
    from executorch.exir import to_edge
    from etfuse.passes import LoopLoweringPass
    from etfuse.runtime import load_method

    kernels()
    torch.manual_seed(spec.seed)
    model = FuzzModel(spec)
    args = example_inputs(spec)
    # -- export (unsupported => skip) --
    try:
        with torch.no_grad():
            if spec.quant:
                model = _pt2e_int8(model, args)
            ep = torch.export.export(model, args, dynamic_shapes=spec.dynamic_shapes())
        # two independent edge programs: to_executorch() rewrites programs in place and shares
        # graph modules with anything derived from them.
        edge_unfused = to_edge(ep)
        edge = copy.deepcopy(edge_unfused)
    except Exception as e:  # noqa: BLE001
        return Outcome(SKIP, _err(e), _err(e))
    if spec.has_while:
        # Stock executorch cannot emit while_loop: the unfused program gets etfuse's loop
        # lowering only (no fusion).
        try:
            edge_unfused = etfuse.fuse(edge_unfused, [LoopLoweringPass()])
        except Exception as e:  # noqa: BLE001
            return Outcome(ETFUSE_ERROR, f"LoopLoweringPass: {_err(e)}\n{traceback.format_exc()[-1500:]}", _err(e))
    edge_routes = copy.deepcopy(edge) if routes else None
    # -- fuse --
    try:
        fused, rules, changed = fuse_instrumented(edge)
        fused_lowered = copy.deepcopy(fused)
    except Exception as e:  # noqa: BLE001
        return Outcome(ETFUSE_ERROR, f"fuse: {_err(e)}\n{traceback.format_exc()[-1500:]}", _err(e))
    info = dict(fused_ops=fused_ops(fused.exported_program()), rules=rules, passes=sorted(changed))
    # -- fused program in torch eager, and retraced to ATen --
    try:
        fused_module = fused.exported_program().module()
    except Exception as e:  # noqa: BLE001
        return Outcome(ETFUSE_ERROR, f"fused .module(): {_err(e)}", _err(e), **info)
    try:
        retraced_module = fused.exported_program().run_decompositions().module()
    except Exception as e:  # noqa: BLE001
        try:  # torch cannot retrace some programs at all (a while_loop: FunctionalTensor used on its own)
            edge.exported_program().run_decompositions()
        except Exception:  # noqa: BLE001
            retraced_module = None  # the unfused program does not retrace either: not etfuse's
        else:
            return Outcome(ETFUSE_ERROR, f"retrace (run_decompositions): {_err(e)}", _err(e), **info)
    # -- unfused and fused on the runtime --
    try:
        unfused_method = load_method(edge_unfused.to_executorch())
        unfused_problem = None
    except Exception as e:  # noqa: BLE001
        unfused_method, unfused_problem = None, _err(e)
    try:
        fused_et = fused_lowered.to_executorch()
        fused_method = load_method(fused_et)
    except Exception as e:  # noqa: BLE001
        if unfused_problem is not None:
            return Outcome(STOCK_ERROR, f"lowering both: {unfused_problem}", unfused_problem, **info)
        return Outcome(ETFUSE_ERROR, f"fused to_executorch: {_err(e)}", _err(e), **info)
    config_method = None
    if routes:  # the third route, run beside the fused program on every input set
        from executorch.exir import ExecutorchBackendConfig
        from etfuse.passes import default_passes

        try:
            config_method = load_method(copy.deepcopy(edge_routes).to_executorch(
                ExecutorchBackendConfig(passes=default_passes())))
        except Exception as e:  # noqa: BLE001
            return Outcome(ETFUSE_ROUTES, f"to_executorch(ExecutorchBackendConfig(passes=default_passes())) raised "
                                          f"where etfuse.fuse(edge).to_executorch() lowers: {_err(e)}\n"
                                          f"{traceback.format_exc()[-1500:]}", _err(e), **info)

    if spec.quant:
        step = _quant_step(fused.exported_program())
        atol, rtol = 1.01 * step, 0.0   # within one quantization step of the coarsest tensor
    else:
        atol, rtol = 1e-4, 1e-4
    stock_bug = None
    int8_exact = None
    first_fused = None  # (runtime inputs, x86 fused runtime outputs) of input set 0, for `aarch64`
    on_aarch64 = False
    # (input set, batch): `runs` sets at S's batch, then one at each other size of a dynamic batch
    sets = [(k, None) for k in range(runs)] + [(runs + j, b) for j, b in enumerate(spec.batch_sizes()[1:])]
    for k, batch in sets:
        a = example_inputs(spec, k, batch)
        bt = "" if batch is None else f", batch {batch}"
        with torch.no_grad():
            want = list(model(*a))
            try:
                fe = list(fused_module(*a))
            except Exception as e:  # noqa: BLE001
                return Outcome(ETFUSE_ERROR, f"fused eager run: {_err(e)}", _err(e), **info)
        ra = runtime_inputs(a)
        try:
            fr = list(fused_method.execute(ra))
        except Exception as e:  # noqa: BLE001
            fr, fr_problem = None, _err(e)
        if k == 0 and fr is not None:
            first_fused = (ra, [t.clone() for t in fr])
        ur, ur_problem = None, unfused_problem
        if unfused_method is not None:
            try:
                ur = list(unfused_method.execute(ra))
            except Exception as e:  # noqa: BLE001
                ur_problem = _err(e)
        if ur is not None:
            ur_bad = _compare(ur, want, atol, rtol)
        else:
            ur_bad = f"unfused runtime: {ur_problem}"
        if spec.quant and ur is not None:
            # int8: the fused program against the unfused runtime, within one step
            ref, ref_name = ur, "unfused runtime"
        else:
            ref, ref_name = want, "eager"
        fe_bad = _compare(fe, want, atol, rtol)
        if fe_bad:
            return Outcome(ETFUSE_MISMATCH, f"fused eager vs eager (input set {k}{bt}): {fe_bad}", **info)
        try:
            with torch.no_grad():
                rt = want if retraced_module is None else list(retraced_module(*a))
        except Exception as e:  # noqa: BLE001
            return Outcome(ETFUSE_ERROR, f"retraced run: {_err(e)}", _err(e), **info)
        rt_bad = _compare(rt, want, atol, rtol)
        if rt_bad:
            return Outcome(ETFUSE_MISMATCH, f"retraced ATen program vs eager (input set {k}{bt}): {rt_bad}", **info)
        if spec.quant and fr is not None and ur is not None:
            same = len(fr) == len(ur) and all(torch.equal(x, y) for x, y in zip(fr, ur))
            int8_exact = same if int8_exact is None else (int8_exact and same)
        fr_bad = f"fused runtime raised {fr_problem}" if fr is None else _compare(fr, ref, atol, rtol)
        if ur_bad is None or (spec.quant and ur is not None):
            if fr is None:
                return Outcome(ETFUSE_ERROR, f"fused runtime (input set {k}{bt}): {fr_problem}", fr_problem, **info)
            if fr_bad:
                return Outcome(ETFUSE_MISMATCH, f"fused runtime vs {ref_name} (input set {k}{bt}): {fr_bad}", **info)
            if spec.quant and ur_bad is not None:
                # both runtimes agree, both differ from the quantized eager module by > 1 step
                fr_eager = _compare(fr, want, 4 * atol, 0.0)
                if fr_eager:
                    stock_bug = stock_bug or Outcome(STOCK_BUG, f"quant: both runtimes vs eager: {ur_bad}", fused_ok=False)
        else:
            if ur is None and fr is not None and fr_bad and not spec.quant:
                # the stock runtime cannot run it (no dequantize_affine kernel, ...): eager is the
                # reference, unless the stock program of the wrong outputs alone runs and is wrong
                # the same way (a stock kernel upstream of them; fuzz seed 44 graph 2551)
                wrong = wrong_outputs(fr, want, atol, rtol)
                alone = _stock_outputs(spec, wrong, ra)
                if not (isinstance(alone, list) and _compare(alone, [fr[i] for i in wrong], atol, rtol) is None):
                    return Outcome(ETFUSE_MISMATCH, f"fused runtime vs eager, the stock runtime cannot run the program "
                                                    f"({ur_problem}; outputs {wrong} alone: "
                                                    f"{alone if isinstance(alone, str) else 'other values'}) "
                                                    f"(input set {k}{bt}): {fr_bad}", **info)
                ur_bad = (f"outputs {wrong} alone, on the stock runtime: {_compare(alone, [want[i] for i in wrong], atol, rtol)} "
                          f"(the whole program: {ur_problem})")
                ur, ur_problem = alone, ""
            elif ur is not None:
                # (float) the stock runtime runs and is wrong: the fused one must be right, or wrong as the
                # stock one is (a stock kernel it kept; fuzz seed 44 graphs 1824, 2235, 3376), output
                # for output; anything else is etfuse's
                if fr is None:
                    return Outcome(ETFUSE_ERROR, f"fused runtime (input set {k}{bt}), where the stock runtime runs: "
                                                 f"{fr_problem}", fr_problem, **info)
                wrong = wrong_outputs(fr, want, atol, rtol)
                off = _compare([fr[i] for i in wrong], [ur[i] for i in wrong], atol, rtol)
                if off:
                    return Outcome(ETFUSE_MISMATCH, f"fused runtime vs eager and vs the stock runtime, which is wrong "
                                                    f"too (input set {k}{bt}; outputs {wrong}): {off}", **info)
            kind = STOCK_ERROR if ur is None else STOCK_BUG
            stock_bug = stock_bug or Outcome(kind, f"unfused runtime vs eager (input set {k}{bt}): {ur_bad}; "
                                                   f"fused runtime: {fr_bad or 'matches eager'}",
                                             ur_problem or "", fused_ok=fr_bad is None)
        if config_method is not None and fr is not None and not fr_bad:
            # the config route: the same numbers as the fused program's reference, same tolerance
            try:
                cr_bad = _compare(list(config_method.execute(ra)), ref, atol, rtol)
            except Exception as e:  # noqa: BLE001
                cr_bad = f"raised {_err(e)}"
            if cr_bad:
                return Outcome(ETFUSE_ROUTES, f"to_executorch(ExecutorchBackendConfig(passes=default_passes())) vs "
                                              f"{ref_name} (input set {k}{bt}), where the fused program matches: "
                                              f"{cr_bad}", **info)
    # -- the fused .pte on aarch64 (the C++ runner), against the x86 fused runtime: the same
    # tolerance as the fused program against eager (float sums in another order; int8 within a step)
    if aarch64 is not None and first_fused is not None and aarch64_checkable(spec, first_fused[0]):
        ra, fr = first_fused
        got = run_aarch64(aarch64, fused_et.buffer, ra, fr)
        bad = got if isinstance(got, str) else _compare(got, fr, atol, rtol)
        if bad:
            return Outcome(ETFUSE_AARCH64, f"aarch64 runner vs x86 fused runtime (input set 0): {bad}", **info)
        on_aarch64 = True
    # -- the transform route: etfuse.fuse's program, so the same .pte operator plan --
    if routes:
        from etfuse.passes import default_passes

        try:
            by_transform = copy.deepcopy(edge_routes).transform(default_passes()).to_executorch()
        except Exception as e:  # noqa: BLE001
            return Outcome(ETFUSE_ROUTES, f"edge.transform(default_passes()).to_executorch() raised where "
                                          f"etfuse.fuse(edge).to_executorch() lowers: {_err(e)}", _err(e), **info)
        want_plan, got_plan = functional_plan(plan_ops(fused_et)), functional_plan(plan_ops(by_transform))
        if want_plan != got_plan:
            return Outcome(ETFUSE_ROUTES, f"operator plans differ: etfuse.fuse(edge) {want_plan}, "
                                          f"edge.transform(default_passes()) {got_plan}", **info)
    # -- fusing twice is fusing once (after the comparisons: a wrong program is a mismatch first) --
    try:
        again = etfuse.fuse(fused)
    except Exception as e:  # noqa: BLE001
        return Outcome(ETFUSE_ERROR, f"fuse of the fused program: {_err(e)}\n{traceback.format_exc()[-1500:]}",
                       _err(e), **info)
    once, twice = op_list(fused.exported_program()), op_list(again.exported_program())
    if once != twice:
        return Outcome(ETFUSE_UNSTABLE, f"fusing the fused program again: {once} -> {twice}", **info)
    out = stock_bug or Outcome(PASS)
    out.fused_ops, out.rules, out.passes = info["fused_ops"], info["rules"], info["passes"]
    out.int8_exact, out.aarch64 = int8_exact, on_aarch64
    return out


# --- shrinking a failure from the fuzz script --------------------------------------------------------
# (hypothesis shrinks the test's failures itself; this greedy one shrinks a `RandomDraw` model)

def _rename(op: Op, f) -> Op:
    return dataclasses.replace(op, args=tuple(f(a) for a in op.args))


def _without_op(spec: ModelSpec, j: int) -> ModelSpec:
    """Op j removed; its users read its first operand instead."""
    n = len(spec.inputs)
    v, sub = n + j, spec.ops[j].args[0]

    def f(a):
        return sub if a == v else (a - 1 if a > v else a)

    ops = tuple(_rename(op, f) for k, op in enumerate(spec.ops) if k != j)
    outputs = tuple(dict.fromkeys(f(o) for o in spec.outputs))
    return dataclasses.replace(spec, ops=ops, outputs=outputs)


def _without_body_op(body: tuple, k: int) -> tuple:
    sub = body[k].args[0]

    def f(a):
        if isinstance(a, str):
            return a
        return sub if a == k else (a - 1 if a > k else a)

    return tuple(_rename(op, f) for i, op in enumerate(body) if i != k)


def _live(spec: ModelSpec) -> ModelSpec:
    """Ops no output depends on removed."""
    n = len(spec.inputs)
    needed = set(spec.outputs)
    for j in reversed(range(len(spec.ops))):
        if n + j in needed:
            needed |= set(spec.ops[j].args)
    for j in reversed(range(len(spec.ops))):
        if n + j not in needed:
            spec = _without_op(spec, j)
    return spec


def _candidates(spec: ModelSpec):
    if len(spec.outputs) > 1:
        for o in spec.outputs:
            yield dataclasses.replace(spec, outputs=(o,))
    for j in reversed(range(len(spec.ops))):
        yield _without_op(spec, j)
    for j, op in enumerate(spec.ops):
        for b, body in enumerate(op.bodies):
            for k in reversed(range(len(body))):
                if len(body) > 1:
                    bodies = list(op.bodies)
                    bodies[b] = _without_body_op(body, k)
                    ops = list(spec.ops)
                    ops[j] = dataclasses.replace(op, bodies=tuple(bodies))
                    yield dataclasses.replace(spec, ops=tuple(ops))
    if spec.dynamic_batch:
        yield dataclasses.replace(spec, dynamic_batch=())
    if spec.seed:
        yield dataclasses.replace(spec, seed=0)


def shrink(spec: ModelSpec, still_fails, log=print) -> ModelSpec:
    """Greedy: keep any one-step simplification for which `still_fails(spec)` holds, until none does."""
    live = _live(spec)
    if live != spec and _safe(still_fails, live):
        spec = live
    progress = True
    while progress:
        progress = False
        for cand in _candidates(spec):
            if _safe(still_fails, cand):
                spec, progress = cand, True
                log(f"shrunk to {len(spec.ops)} ops")
                break
    return spec


def _safe(pred, spec) -> bool:
    try:
        return bool(pred(spec))
    except Exception:  # noqa: BLE001  (an invalid model: not a simplification)
        return False


# --- the coverage sample (tests/test_fuzz_coverage.py) ------------------------------------------------

def _structural_specs(seed: int) -> list:
    """Control flow the passes need: a while loop (LoopLoweringPass), two conds whose first result
    outlives the second (CondOutputCopyPass), a cond result read through a view
    (CondViewCopyPass), a cond around a block, a scan, blocks in while / scan bodies, a dynamic
    batch with shape arithmetic (SymIntToPrimsPass)."""
    s2, s3, s4 = (3, 4), (2, 3, 4), (1, 2, 3, 4)
    gemm = ("gemm", "relu", True, False, "none")
    while_body = (Op("mul", ("a", "b")), Op("clamp", (0,), (-1.0, 1.0)))
    relu_a, mul_ab = (Op("relu", ("a",)),), (Op("mul", ("a", "b")),)
    return [
        ModelSpec(s2, (s2,), (Op("while", (0, 0), (2,), (while_body,)),), (1,), seed=seed),
        ModelSpec(s2, (s2, s2), (Op("cond", (1, 0, 1), (), (relu_a, mul_ab)),
                                 Op("cond", (0, 0, 1), (), ((Op("add", ("a", "b")),), (Op("sub", ("a", "b")),))),
                                 Op("add", (2, 3))), (4,), seed=seed),
        ModelSpec(s4, (s4,), (Op("cond", (0, 0, 0), (), (relu_a, (Op("mul", ("a", "a")),))),
                              Op("block", (1,), ("permute", True, (1, 0, 2, 3, 4))), Op("relu", (2,))), (3,), seed=seed),
        ModelSpec(s2, (s2,), (Op("cond", (0, 0, 0), (), ((Op("block", ("a",), gemm),), relu_a)),), (1,), seed=seed),
        ModelSpec(s2, (s2,), (Op("scan", (0, 0), ("ys",), ((Op("add", ("a", "b")), Op("relu", (0,))),)),), (1,),
                  seed=seed),
        # blocks in loop bodies: a while around a linear + relu, a scan step around an RMS norm
        ModelSpec(s2, (s2,), (Op("while", (0, 0), (2,), ((Op("block", ("a",), gemm), Op("mul", (0, "b"))),)),), (1,),
                  seed=seed),
        ModelSpec(s3, (s3,), (Op("scan", (0, 0), ("ys",), ((Op("block", ("a",), ("norm", "rms_mul")),
                                                             Op("add", (0, "b"))),)),), (1,), seed=seed),
        # a dynamic batch: shape arithmetic (SymIntToPrimsPass), beside a rank-3 linear and a cond
        ModelSpec(s3, (s3, s3), tuple(Op("block", (0,), ("symshape", f)) for f in ("merge", "scale"))
                  + (Op("block", (0,), ("gemm", "silu", True, False, "none")),
                     Op("cond", (1, 0, 1), (), ((Op("block", ("a",), ("symshape", "scale")),), relu_a))),
                  (2, 3, 4, 5), seed=seed, dynamic_batch=(2, 6)),
    ]


def coverage_sample(seed: int = 0, per_spec: int = 16) -> list:
    """The fixed sample: every block of fuzz_blocks.BLOCKS with every combination of its key choices
    (float, and int8 where the block allows it) at each of its coverage shapes, the other choices
    drawn from `random.Random(seed)`; `per_spec` blocks side by side on one input per model (each
    block's result an output); then the structural control-flow specs."""
    from fuzz_blocks import BLOCKS, ForcedDraw, key_combinations

    rng = random.Random(seed)
    specs = []
    for block in BLOCKS.values():
        for shape in block.shapes:
            for quant in (False, True) if block.quant_ok else (False,):
                ops = [Op("block", (0,), (block.name, *block.draw(ForcedDraw(combo, rng), shape, quant)))
                       for combo in key_combinations(block, shape, quant)]
                # key choices a block ignores (an activation beside a residual) give the same op
                ops = list({op.params[:-3] if block.name == "conv" else op.params: op for op in ops}.values())
                for i in range(0, len(ops), per_spec):
                    chunk = tuple(ops[i:i + per_spec])
                    outputs = tuple(range(1, len(chunk) + 1))
                    if quant:  # each result read by a quantized op (an add): its activation is quantized
                        chunk += tuple(Op("add", (k, 0)) for k in outputs)
                        outputs = tuple(range(len(outputs) + 1, len(chunk) + 1))
                    specs.append(ModelSpec(tuple(shape), (tuple(shape),), chunk, outputs, quant, rng.randint(0, 3)))
    return specs + _structural_specs(seed)


def export_edge(spec: ModelSpec):
    """The model of `spec` exported (PT2E-quantized when `spec.quant`) and lowered to edge."""
    from executorch.exir import to_edge

    torch.manual_seed(spec.seed)
    model = FuzzModel(spec)
    args = example_inputs(spec)
    with torch.no_grad():
        if spec.quant:
            model = _pt2e_int8(model, args)
        return to_edge(torch.export.export(model, args, dynamic_shapes=spec.dynamic_shapes()))


def reproducer(spec: ModelSpec, outcome: "Outcome", note: str = "", aarch64: Optional[list] = None) -> str:
    """A standalone script (it imports this module from the repository's tests/) that rebuilds
    `spec`, runs the four-way check (and with `aarch64`, the runner command, the aarch64 one) and
    exits 1 while the failure is still there."""
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    comment = "\n".join(f"#   {line}" for line in repr(spec).splitlines())
    detail = "\n".join(f"#   {line}" for line in str(outcome).splitlines()[:12])
    return f'''"""etfuse fuzz reproducer{': ' + note if note else ''}."""
# The model:
{comment}
# Outcome when written:
{detail}
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, {tests!r})
from fuzz_models import FAILURES, ModelSpec, Op, check  # noqa: E402

spec = {spec.code()}

if __name__ == "__main__":
    print(repr(spec))
    outcome = check(spec, routes=True, aarch64={aarch64!r})
    print(outcome)
    sys.exit(1 if outcome.kind in FAILURES else 0)
'''
