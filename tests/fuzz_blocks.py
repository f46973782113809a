"""Building blocks of the fuzz generator (tests/fuzz_models.py): one small module per way a rule
family or pass meets real models, each spelled as models spell it (read from patterns/*_rules.py
and from the rule families' own tests).

A block turns one value of the model's main shape S into one result. Its choices are drawn from
the generator's `Draw` (so hypothesis can shrink them and a seeded `random.Random` can replay
them); the first `len(block.keys(S))` draws are its *key* choices (the ones that decide which rule
can fire: the activation, bias, batch norm, bits, mask, ...), drawn as `draw.int(0, n - 1)` with
0 the simplest. The coverage test (tests/test_fuzz_coverage.py) enumerates every combination of
key choices for each block and shape in `block.shapes` with `ForcedDraw`; the random generator
draws them like every other choice.

A block's result either broadcasts against S (the generator may use it further) or is a *sink*
(another shape: pooled maps, permuted tensors, embeddings), which the model returns as an output.

    params = block.draw(draw, S)           # a tuple of constants: Op("block", (a,), (name, *params))
    module = block.build(params, S, g)     # nn.Module, forward(x) -> tensor
    block.out_shape(params, S)

`quant_ok`: the block may appear in a PT2E int8 model (XNNPACK quantizer); only its `qkeys` choices
are drawn there (acts the quantizer folds: none, relu, relu6).
"""

from __future__ import annotations

import itertools
import math
import random

import torch
import torch.nn.functional as F

qd = torch.ops.quantized_decomposed


class ForcedDraw:
    """The first draws return `forced` (ints, bools from ints); the rest come from `rng`."""

    def __init__(self, forced, rng: random.Random):
        self.forced, self.rng = list(forced), rng

    def int(self, lo: int, hi: int) -> int:
        if self.forced:
            v = self.forced.pop(0)
            assert lo <= v <= hi, (v, lo, hi)
            return v
        return self.rng.randint(lo, hi)

    def bool(self, p: float = 0.5) -> bool:
        if self.forced:
            return bool(self.forced.pop(0))
        return self.rng.random() < p


# --- activations, as models write them -----------------------------------------------------------

ACTS = ("none", "relu", "relu6", "hardtanh", "clamp", "silu", "sigmoid", "gelu", "gelu_tanh", "hardswish",
        "hardsigmoid")
QACTS = ("none", "relu", "relu6", "hardtanh")  # what the int8 rules take after a conv / linear


def act(name: str, y):
    if name == "none":
        return y
    if name == "relu":
        return torch.relu(y)
    if name == "relu6":
        return F.relu6(y)
    if name == "hardtanh":
        return F.hardtanh(y, -1.0, 1.0)
    if name == "clamp":
        return torch.clamp(y, -0.5, 2.0)
    if name == "silu":
        return F.silu(y)
    if name == "sigmoid":
        return torch.sigmoid(y)
    if name == "gelu":
        return F.gelu(y)
    if name == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if name == "hardswish":
        return F.hardswish(y)
    if name == "hardsigmoid":
        return F.hardsigmoid(y)
    raise AssertionError(name)


def _randn(g, *shape, scale=0.5):
    return torch.randn(shape, generator=g) * scale


def _init(module: torch.nn.Module, g) -> torch.nn.Module:
    """Seeded weights, batch-norm statistics that are not the identity, eval mode."""
    for p in module.parameters():
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return module.eval()


class Block:
    name = ""
    family = ""          # the rule family (patterns/<family>_rules.py) or pass it is for
    quant_ok = False
    dynamic_ok = True    # the model may be exported with a dynamic batch (fuzz_models.dynamic_ok)
    shapes: tuple = ()   # main shapes the coverage sample uses

    def accepts(self, shape) -> bool:
        raise NotImplementedError

    def keys(self, shape, quant: bool = False) -> list:
        """Sizes of the key choices for main shape `shape`."""
        return []

    def draw(self, draw, shape, quant: bool = False) -> tuple:
        return tuple(draw.int(0, n - 1) for n in self.keys(shape, quant))

    def build(self, params, shape, g) -> torch.nn.Module:
        raise NotImplementedError

    def out_shape(self, params, shape) -> tuple:
        return tuple(shape)

    def describe(self, params) -> str:
        return ", ".join(map(str, params))


class _Fn(torch.nn.Module):
    """A module whose forward is a function of (self, x): blocks keep their weights as attributes."""

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def forward(self, x):
        return self._fn(self, x)


# --- GEMM / conv with epilogues ----------------------------------------------------------------------

class Gemm(Block):
    """nn.Linear over the last dim: act, bias, batch norm (rank 2), residual add (+ relu).
    Rank 2: gemm_conv_rules' linear[_bn]_<act>[_no_bias]; rank >= 3: linear_rank_rules'
    linear_nd[_no_bias][_act]; with residual: linear_residual_rules; int8: quantized_gemm_rules."""

    name, family, quant_ok = "gemm", "gemm_conv", True
    shapes = ((3, 4), (2, 3, 4))
    RES = ("none", "add", "add_relu")

    def accepts(self, shape):
        return len(shape) in (2, 3)

    def keys(self, shape, quant=False):
        acts = QACTS if quant else ACTS
        # act, bias, bn (rank 2 only), residual (none, add, add + relu; then no act of its own)
        return [len(acts), 2, 2 if len(shape) == 2 else 1, len(self.RES)]

    def draw(self, draw, shape, quant=False):
        a, bias, bn, res = super().draw(draw, shape, quant)
        name = (QACTS if quant else ACTS)[a]
        if res:
            name = "none"
        return (name, bool(bias), bool(bn), self.RES[res])

    def build(self, params, shape, g):
        a, bias, bn, res = params
        f = shape[-1]
        m = _Fn(lambda self, x: self._res(x, act(a, self.seq(x))))
        m.seq = torch.nn.Sequential(torch.nn.Linear(f, f, bias=bias), *([torch.nn.BatchNorm1d(f)] if bn else []))
        m._res = lambda x, y: y if res == "none" else (x + y if res == "add" else torch.relu(y + x))
        return _init(m, g)

    def describe(self, p):
        return ", ".join([p[0]] + [k for k, on in zip(("bias", "bn"), p[1:3]) if on] + ([p[3]] if p[3] != "none" else []))


class Conv(Block):
    """nn.Conv2d (k 1 or 3, same padding, maybe depthwise or strided-free) with act, bias, batch
    norm, residual: gemm_conv_rules' conv2d[_bn]_<act>, conv_residual_rules; int8:
    quantized_conv2d[...]."""

    name, family, quant_ok = "conv", "gemm_conv", True
    shapes = ((1, 4, 4, 4),)
    RES = ("none", "add", "add_relu")

    def accepts(self, shape):
        return len(shape) == 4

    def keys(self, shape, quant=False):
        return [len(QACTS if quant else ACTS), 2, len(self.RES)]

    def draw(self, draw, shape, quant=False):
        a, bn, res = super().draw(draw, shape, quant)
        name = "none" if res else (QACTS if quant else ACTS)[a]
        k = (1, 3)[draw.int(0, 1)]
        dw = shape[1] > 1 and draw.bool(0.3)
        return (name, bool(bn), self.RES[res], k, draw.bool(0.7), dw)

    def build(self, params, shape, g):
        a, bn, res, k, bias, dw = params
        c = shape[1]
        m = _Fn(lambda self, x: self._res(x, act(a, self.seq(x))))
        m.seq = torch.nn.Sequential(torch.nn.Conv2d(c, c, k, padding=k // 2, bias=bias, groups=c if dw else 1),
                                    *([torch.nn.BatchNorm2d(c)] if bn else []))
        m._res = lambda x, y: y if res == "none" else (y + x if res == "add" else torch.relu(y + x))
        return _init(m, g)

    def describe(self, p):
        a, bn, res, k, bias, dw = p
        return ", ".join([a, f"k={k}"] + [n for n, on in (("bn", bn), ("bias", bias), ("dw", dw)) if on]
                         + ([res] if res != "none" else []))


class Conv1d(Block):
    """nn.Conv1d on [B, C, L] with act (relu, hardtanh, clamp or none) and batch norm:
    gemm_conv_rules' conv1d[_bn][_act] (their unsqueezes are UnitDimViewsPass's)."""

    name, family = "conv1d", "gemm_conv"
    shapes = ((2, 3, 5),)
    A = ("none", "relu", "hardtanh", "clamp")

    def accepts(self, shape):
        return len(shape) == 3

    def keys(self, shape, quant=False):
        return [len(self.A), 2]

    def draw(self, draw, shape, quant=False):
        a, bn = super().draw(draw, shape)
        return (self.A[a], bool(bn), (1, 3)[draw.int(0, 1)], draw.bool(0.7))

    def build(self, params, shape, g):
        a, bn, k, bias = params
        c = shape[1]
        m = _Fn(lambda self, x: act(a, self.seq(x)))
        m.seq = torch.nn.Sequential(torch.nn.Conv1d(c, c, k, padding=k // 2, bias=bias),
                                    *([torch.nn.BatchNorm1d(c)] if bn else []))
        return _init(m, g)


class Addmm(Block):
    """relu(torch.addmm(b, x, W)) with W used as stored (no transpose): float_rules' addmm_relu."""

    name, family = "addmm", "float"
    shapes = ((3, 4),)

    def accepts(self, shape):
        return len(shape) == 2

    def keys(self, shape, quant=False):
        return [2]

    def build(self, params, shape, g):
        (relu,) = params
        f = shape[-1]
        m = _Fn(lambda self, x: act("relu" if relu else "none", torch.addmm(self.b, x, self.w)))
        m.w, m.b = torch.nn.Parameter(_randn(g, f, f)), torch.nn.Parameter(_randn(g, f))
        return m


class Gated(Block):
    """llama's FeedForward w2(act(w1(x)) * w3(x)) (GatedLinearsPass joins w1 and w3)."""

    name, family = "gated", "pass:GatedLinearsPass"
    shapes = ((3, 4), (1, 2, 4))

    def accepts(self, shape):
        return len(shape) in (2, 3)

    def keys(self, shape, quant=False):
        return [2, 2]

    def build(self, params, shape, g):
        gelu, bias = params
        f = shape[-1]
        m = _Fn(lambda self, x: self.w2(act("gelu" if gelu else "silu", self.w1(x)) * self.w3(x)))
        m.w1, m.w3 = torch.nn.Linear(f, 2 * f, bias=bool(bias)), torch.nn.Linear(f, 2 * f, bias=bool(bias))
        m.w2 = torch.nn.Linear(2 * f, f, bias=bool(bias))
        return _init(m, g)


# --- pooling -----------------------------------------------------------------------------------------

POOLS = (
    # (kind, ceil, stride default, count_include_pad)
    *[("max", c, s, True) for c in (False, True) for s in (False, True)],
    *[("avg", c, s, p) for c in (False, True) for s in (False, True) for p in (True, False)],
    ("mean", (-2, -1)), ("mean", (-1, -2)), ("mean", (2, 3)), ("mean", (3, 2)), ("adaptive", 1),
)


class Pool(Block):
    """max_pool2d / avg_pool2d (ceil, default stride, count_include_pad), mean over H, W in each
    spelling (keepdim or not), adaptive_avg_pool2d(1): pool_rules."""

    name, family = "pool", "pool"
    shapes = ((1, 2, 5, 5),)

    def accepts(self, shape):
        return len(shape) == 4 and min(shape[2:]) >= 3

    def keys(self, shape, quant=False):
        return [len(POOLS), 2]  # spelling, keepdim (mean only)

    def draw(self, draw, shape, quant=False):
        i, keep = super().draw(draw, shape)
        spec = POOLS[i]
        if spec[0] in ("max", "avg"):
            k = (2, 3)[draw.int(0, 1)]
            pad = draw.int(0, k // 2)
            return (*spec, k, pad)
        return (*spec, bool(keep))

    def build(self, params, shape, g):
        kind = params[0]
        if kind == "max":
            _, ceil, sdef, _, k, pad = params
            return _Fn(lambda self, x: F.max_pool2d(x, k, None if sdef else 1, pad, ceil_mode=ceil))
        if kind == "avg":
            _, ceil, sdef, cip, k, pad = params
            return _Fn(lambda self, x: F.avg_pool2d(x, k, None if sdef else 1, pad, ceil_mode=ceil,
                                                    count_include_pad=cip))
        if kind == "mean":
            _, dims, keep = params
            return _Fn(lambda self, x: x.mean(dims, keepdim=keep))
        return _Fn(lambda self, x: F.adaptive_avg_pool2d(x, 1))

    def out_shape(self, params, shape):
        return tuple(self.build(params, shape, None)(torch.zeros(shape)).shape)


# --- attention, norms, rope, KV cache ------------------------------------------------------------------

class Attention(Block):
    """F.scaled_dot_product_attention on x as q [B, H, L, D]: mask none / float / bool / causal,
    grouped k, v heads through repeat_interleave (llama), batch 1 (the `_closed` forms): attention_rules."""

    name, family = "attention", "attention"
    shapes = ((1, 2, 3, 4), (2, 2, 3, 4))
    MASKS = ("none", "float", "bool", "causal")

    def accepts(self, shape):
        return len(shape) == 4

    def keys(self, shape, quant=False):
        # mask, grouped heads, v narrower than q / k (Dv != D: the decomposition's end differs)
        return [len(self.MASKS), 2 if shape[1] % 2 == 0 else 1, 2 if shape[-1] > 1 else 1]

    def draw(self, draw, shape, quant=False):
        mask, grouped, narrow = super().draw(draw, shape)
        return (self.MASKS[mask], bool(grouped), draw.bool(0.3), bool(narrow))

    def out_shape(self, params, shape):
        return (*shape[:-1], shape[-1] - 1) if params[3] else tuple(shape)

    def describe(self, p):
        return ", ".join([f"mask={p[0]}"] + [k for k, on in zip(("grouped", "scale=0.3", "narrow v"), p[1:]) if on])

    def build(self, params, shape, g):
        mask, grouped, scaled, narrow = params
        b, h, length, d = shape
        hk = h // 2 if grouped else h
        m = _Fn(Attention._forward)
        m.mask_kind, m.grouped, m.rep, m.scale = mask, grouped, h // hk, (0.3 if scaled else None)
        m.dv = d - 1 if narrow else d
        m.k, m.v = torch.nn.Parameter(_randn(g, 1, hk, length, d)), torch.nn.Parameter(_randn(g, 1, hk, length, d))
        m.register_buffer("fmask", _randn(g, length, length))
        m.register_buffer("bmask", torch.rand(length, length, generator=g) > 0.3)
        return m

    @staticmethod
    def _forward(self, x):
        k = x[:, : self.k.shape[1]] * 0.5 + self.k
        v = (x[:, : self.v.shape[1]] - self.v)[..., : self.dv]
        if self.grouped:
            k, v = k.repeat_interleave(self.rep, dim=1), v.repeat_interleave(self.rep, dim=1)
        kw = dict(scale=self.scale)
        if self.mask_kind == "float":
            kw["attn_mask"] = self.fmask
        elif self.mask_kind == "bool":
            kw["attn_mask"] = self.bmask
        elif self.mask_kind == "causal":
            kw["is_causal"] = True
        return F.scaled_dot_product_attention(x, k, v, **kw)


class Norm(Block):
    """LayerNorm over the last dim (affine, weight only, none, F.layer_norm) and RMS norm as llama
    (x * x) and transformers (x.pow(2)) write it, with and without weight: norm_rules."""

    name, family = "norm", "norm"
    shapes = ((3, 4), (2, 3, 4))
    FORMS = ("layer_affine", "layer_none", "layer_functional", "rms_mul", "rms_mul_no_weight", "rms_pow",
             "rms_pow_no_weight")

    def accepts(self, shape):
        return len(shape) >= 2 and shape[-1] > 1

    def keys(self, shape, quant=False):
        return [len(self.FORMS)]

    def draw(self, draw, shape, quant=False):
        (i,) = super().draw(draw, shape)
        return (self.FORMS[i],)

    def build(self, params, shape, g):
        (form,) = params
        f = shape[-1]
        m = _Fn(Norm._forward)
        m.form = form
        m.weight, m.bias = torch.nn.Parameter(_randn(g, f) + 1), torch.nn.Parameter(_randn(g, f))
        if form == "layer_affine":
            m.ln = torch.nn.LayerNorm(f)
            _init(m.ln, g)
        elif form == "layer_none":
            m.ln = torch.nn.LayerNorm(f, elementwise_affine=False)
        return m

    @staticmethod
    def _forward(self, x):
        form, eps = self.form, 1e-5
        if form.startswith("layer_"):
            return self.ln(x) if hasattr(self, "ln") else F.layer_norm(x, (x.shape[-1],), self.weight, self.bias)
        if form.startswith("rms_mul"):
            y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
            return y if form.endswith("no_weight") else y * self.weight
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y if form.endswith("no_weight") else self.weight * y


class Rope(Block):
    """executorch llama's apply_rotary_emb on x [B, S, H, D] (D even), cos / sin [1, S, 1, D/2] or
    [S, D/2] slices of precomputed tables: rope_rules."""

    name, family = "rope", "rope"
    shapes = ((1, 3, 2, 4), (2, 3, 1, 4))

    def accepts(self, shape):
        return len(shape) == 4 and shape[-1] % 2 == 0

    def keys(self, shape, quant=False):
        return [2]

    def build(self, params, shape, g):
        (flat,) = params
        b, s, h, d = shape
        freqs = torch.outer(torch.arange(s + 2, dtype=torch.float32), 1.0 / (10000 ** (torch.arange(0, d, 2) / d)))
        m = _Fn(Rope._forward)
        m.register_buffer("cos", torch.cos(freqs))
        m.register_buffer("sin", torch.sin(freqs))
        m.flat, m.s = flat, s
        return m

    @staticmethod
    def _forward(self, x):
        cos, sin = self.cos[: self.s], self.sin[: self.s]
        if self.flat:  # [S, 1, D/2]
            cos, sin = cos[:, None, :], sin[:, None, :]
        else:  # [1, S, 1, D/2]
            cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        r, i = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
        return torch.stack([r * cos - i * sin, r * sin + i * cos], dim=-1).flatten(3)


class KVCache(Block):
    """A cache write `c[:, pos] = v` / `c[:, :, pos] = v` (index_put at dim 1 or 2) on a copy of x:
    cache_rules."""

    name, family = "kv_cache", "cache"
    shapes = ((1, 3, 4, 2),)

    def accepts(self, shape):
        return len(shape) == 4 and shape[1] >= 2 and shape[2] >= 2

    def keys(self, shape, quant=False):
        return [2]

    def build(self, params, shape, g):
        (dim2,) = params
        dim = 2 if dim2 else 1
        vshape = list(shape[1:])
        vshape[dim - 1] = 2
        m = _Fn(KVCache._forward)
        m.dim = dim
        m.register_buffer("pos", torch.tensor([shape[dim] - 1, 0]))
        m.v = torch.nn.Parameter(_randn(g, *vshape))
        return m

    @staticmethod
    def _forward(self, x):
        c = x.clone()
        vals = self.v * 2.0
        if self.dim == 1:
            c[:, self.pos] = vals
        else:
            c[:, :, self.pos] = vals
        return c


# --- layout, elementwise broadcasts --------------------------------------------------------------

class Permute(Block):
    """x.permute(...) of rank 2..5 (rank + 1 through an unsqueeze): layout_rules' permute_copy_<r>;
    a permute moving only unit dims is UnitDimViewsPass's."""

    name, family = "permute", "layout"
    shapes = ((3, 4), (2, 3, 4), (1, 2, 3, 4))

    def accepts(self, shape):
        return len(shape) in (2, 3, 4)

    def keys(self, shape, quant=False):
        return [2]  # unsqueeze first (rank + 1)

    def draw(self, draw, shape, quant=False):
        (up,) = super().draw(draw, shape)
        r = len(shape) + up
        perm = list(range(r))
        while perm == list(range(r)):
            perm = [perm[i] for i in _perm(draw, r)]
        return (bool(up), tuple(perm))

    def build(self, params, shape, g):
        up, perm = params
        return _Fn(lambda self, x: (x.unsqueeze(1) if up else x).permute(perm) * 1.5)

    def out_shape(self, params, shape):
        up, perm = params
        s = (shape[0], 1, *shape[1:]) if up else tuple(shape)
        return tuple(s[p] for p in perm)


def _perm(draw, r):
    items, out = list(range(r)), []
    while items:
        out.append(items.pop(draw.int(0, len(items) - 1)))
    return out


class Scale(Block):
    """Broadcast mul / add that float_rules fuse: a squeeze-excite gate (mean -> 1x1 conv ->
    sigmoid -> x * s, mul_channels), a per-channel parameter scale, x * w[C] (mul_rows),
    x + b[C] (add_rows), relu(x + y) (add_relu)."""

    name, family = "scale", "float"
    shapes = ((2, 3, 3, 3), (2, 3, 4))
    FORMS = ("squeeze_excite", "channel_param", "mul_rows", "add_rows", "add_relu")

    def accepts(self, shape):
        return len(shape) >= 2

    def keys(self, shape, quant=False):
        return [len(self.FORMS) if len(shape) == 4 else 3]

    def draw(self, draw, shape, quant=False):
        (i,) = super().draw(draw, shape)
        return ((self.FORMS if len(shape) == 4 else self.FORMS[2:])[i],)

    def build(self, params, shape, g):
        (form,) = params
        c, f = shape[1], shape[-1]
        m = _Fn(Scale._forward)
        m.form = form
        if form == "squeeze_excite":
            m.fc = _init(torch.nn.Conv2d(c, c, 1), g)
        m.s = torch.nn.Parameter(_randn(g, 1, c, 1, 1) if len(shape) == 4 else _randn(g, 1))
        m.w = torch.nn.Parameter(_randn(g, f))
        return m

    @staticmethod
    def _forward(self, x):
        if self.form == "squeeze_excite":
            return x * torch.sigmoid(self.fc(x.mean((2, 3), keepdim=True)))
        if self.form == "channel_param":
            return x * self.s
        if self.form == "mul_rows":
            return x * self.w
        if self.form == "add_rows":
            return x + self.w
        return torch.relu(x + x * self.w.sum())


class Identities(Block):
    """Eval-mode dropout (a copy DropIdentityCopiesPass drops) and a subexpression computed twice
    (CommonSubexpressionPass merges it)."""

    name, family = "identities", "pass"
    shapes = ((3, 4),)

    def accepts(self, shape):
        return True

    def keys(self, shape, quant=False):
        return [2]

    def build(self, params, shape, g):
        (twice,) = params
        if twice:
            return _Fn(lambda self, x: torch.tanh(x * 2.0 + 1.0) - torch.tanh(x * 2.0 + 1.0) * 0.5)
        m = _Fn(lambda self, x: torch.relu(self.drop(torch.tanh(x))))
        m.drop = torch.nn.Dropout(0.3).eval()
        return m


class SymShape(Block):
    """Shape arithmetic on the batch as models write it: a reshape to [B * T, -1] and back, a scale
    by `B // 2 + B % 3`. Static shapes fold it to constants; with a dynamic batch
    (fuzz_models.ModelSpec.dynamic_batch) the program keeps the Python builtins on SymInts that
    SymIntToPrimsPass lowers. (No slice at `B // 2`: export asks for guards it cannot prove over
    the Dim's range, or specialises a size-1 slice.)"""

    name, family = "symshape", "pass:SymIntToPrimsPass"
    shapes = ((3, 4), (2, 3, 4))
    FORMS = ("merge", "scale")

    def accepts(self, shape):
        return len(shape) >= 2

    def keys(self, shape, quant=False):
        return [len(self.FORMS)]

    def draw(self, draw, shape, quant=False):
        (i,) = super().draw(draw, shape)
        return (self.FORMS[i],)

    def build(self, params, shape, g):
        (form,) = params
        m = _Fn(SymShape._forward)
        m.form = form
        return m

    @staticmethod
    def _forward(self, x):
        b = x.shape[0]
        if self.form == "merge":
            return torch.tanh(x.reshape(b * x.shape[1], -1)).reshape(x.shape)
        return x * (b // 2) + (b % 3)


# --- quantized blocks written by hand, weight-only linears, quantized embeddings ---------------------------

_RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


class QuantScalarAdd(Block):
    """x quantized per tensor, then dq -> add scalar -> q as a model written on quantized_decomposed
    ops spells it: a literal (add.Scalar), a float (lifted constant), an int (lifted int64 constant,
    operands swapped): quant_rules' add_scalar[_lifted[_int]]; int8 or uint8."""

    name, family = "qadd_scalar", "quant"
    shapes = ((3, 4),)
    FORMS = ("literal", "float", "int")

    def accepts(self, shape):
        return True

    def keys(self, shape, quant=False):
        return [3, 2]

    def draw(self, draw, shape, quant=False):
        form, u8 = super().draw(draw, shape)
        return (self.FORMS[form], "uint8" if u8 else "int8")

    def build(self, params, shape, g):
        form, dt = params
        dt = getattr(torch, dt)
        lo, hi = _RANGES[dt]
        z1, z2 = (3, -2) if dt == torch.int8 else (128, 120)

        def forward(self, x):
            q = qd.quantize_per_tensor.default(x, 0.05, z1, lo, hi, dt)
            y = qd.dequantize_per_tensor.default(q, 0.05, z1, lo, hi, dt)
            if form == "literal":
                y = torch.ops.aten.add.Scalar(y, 0.37)
            elif form == "float":
                y = y + 0.37
            else:
                y = 2 + y
            q2 = qd.quantize_per_tensor.default(y, 0.04, z2, lo, hi, dt)
            return qd.dequantize_per_tensor.default(q2, 0.04, z2, lo, hi, dt)

        return _Fn(forward)


class QuantGemm(Block):
    """An int8 conv2d / linear written on quantized_decomposed ops, the way a model quantized by
    hand or by a quantizer that closes the activation into the output's quantize spells it:
    dq(q(x)) -> conv / linear with dequantize_per_channel(w) [+ bias] -> then either a requantize
    with the output's own qparams and relu (`q(relu(dq(q(y))))`, equal qparams) or hardtanh
    straight on the float result (`q(hardtanh(y))`) -> q -> dq. The XNNPACK quantizer leaves
    neither (relu after a conv / linear is annotated with it; hardtanh gets its own quantize):
    quantized_gemm_rules' quantized_{conv2d,linear}_requant_relu and _hardtanh[_no_bias].

    Scales are powers of two and the bias a multiple of x_scale * w_scale: every float32 sum of
    the reference is exact, so the fused integer kernel equals it bit for bit (the float
    tolerance of a float model holds)."""

    name, family = "qgemm", "quantized_gemm"
    shapes = ((3, 4), (1, 2, 3, 3))
    ACTS = ("requant_relu", "hardtanh")

    def accepts(self, shape):
        return len(shape) in (2, 4)

    def keys(self, shape, quant=False):
        return [len(self.ACTS), 2 if len(shape) == 2 else 1]  # act, bias (the conv rules take a bias)

    def draw(self, draw, shape, quant=False):
        a, nobias = super().draw(draw, shape)
        k = (1, 3)[draw.int(0, 1)] if len(shape) == 4 else 0
        bounds = ((-1.0, 1.0), (0.0, 6.0), (-0.5, 0.25))[draw.int(0, 2)]
        return (self.ACTS[a], not nobias, k, bounds, "uint8" if draw.bool(0.3) else "int8")

    def build(self, params, shape, g):
        a, bias, k, bounds, dt = params
        dt = getattr(torch, dt)
        lo, hi = _RANGES[dt]
        zx, zo = (3, -5) if dt == torch.int8 else (131, 120)
        c = shape[1] if len(shape) == 4 else shape[-1]
        wshape = (c, c, k, k) if len(shape) == 4 else (c, c)
        m = _Fn(QuantGemm._forward)
        m.register_buffer("w", torch.randint(-127, 128, wshape, dtype=torch.int8, generator=g))
        m.register_buffer("ws", 2.0 ** -torch.randint(5, 8, (c,), generator=g).float())
        m.register_buffer("wz", torch.zeros(c, dtype=torch.int64))
        xs, os = 2.0 ** -4, 2.0 ** -1
        m.b = (torch.nn.Parameter(torch.randint(-2000, 2000, (c,), generator=g).float() * (xs * 2.0 ** -7))
               if bias else None)
        m.act, m.bounds, m.k, m.conv = a, bounds, k, len(shape) == 4
        m.qx, m.qo = (xs, zx, lo, hi, dt), (os, zo, lo, hi, dt)
        return m

    @staticmethod
    def _forward(self, x):
        xq = qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(x, *self.qx), *self.qx)
        w = qd.dequantize_per_channel.default(self.w, self.ws, self.wz, 0, -127, 127, torch.int8)
        y = F.conv2d(xq, w, self.b, padding=self.k // 2) if self.conv else F.linear(xq, w, self.b)
        if self.act == "requant_relu":
            y = torch.relu(qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(y, *self.qo), *self.qo))
        else:
            y = F.hardtanh(y, *self.bounds)
        return qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(y, *self.qo), *self.qo)

    def describe(self, p):
        a, bias, k, bounds, dt = p
        return ", ".join([a + (f"{bounds}" if a == "hardtanh" else ""), dt] + ([f"k={k}"] if k else [])
                         + (["bias"] if bias else []))


def _qweight(g, n, k, bits, groups, zero_points):
    lo, hi = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}[bits]
    q = torch.randint(lo, hi + 1, (n, k), dtype=torch.int8, generator=g)
    s = torch.rand(n, groups, generator=g) * 0.1 + 0.01
    z = (torch.randint(lo, hi + 1, (n, groups), dtype=torch.int8, generator=g) if zero_points
         else torch.zeros(n, groups, dtype=torch.int8))
    return q, s, z, lo, hi


class WeightOnly(Block):
    """A weight-only int8 / int4 linear as torchao's IntxWeightOnlyConfig leaves it
    (dequantize_affine -> linear), on the input widened to K = 32 columns, with bias, SiLU or the
    residual add: weight_only_rules' linear_q{8,4}[_nd][_no_bias][_silu|_residual]."""

    name, family = "weight_only", "weight_only"
    shapes = ((3, 4), (1, 2, 4))
    EPI = ("none", "silu", "residual")

    def accepts(self, shape):
        return len(shape) in (2, 3)

    def keys(self, shape, quant=False):
        return [2, 2, len(self.EPI)]

    def draw(self, draw, shape, quant=False):
        bits4, bias, epi = super().draw(draw, shape)
        return (4 if bits4 else 8, bool(bias), self.EPI[epi], draw.bool(0.5))

    def build(self, params, shape, g):
        bits, bias, epi, zp = params
        f, k = shape[-1], 32
        group = 32 if bits == 4 else k // 2 if draw_half(g) else k
        q, s, z, lo, hi = _qweight(g, f, k, bits, k // group, zp)
        m = _Fn(WeightOnly._forward)
        m.register_buffer("q", q)
        m.register_buffer("s", s)
        m.register_buffer("z", z)
        m.group, m.lo, m.hi, m.epi, m.reps = group, lo, hi, epi, -(-k // f)
        m.b = torch.nn.Parameter(_randn(g, f)) if bias else None
        m.per_token = self.per_token
        return m

    per_token = False  # DynamicQuant's: the input quantized per token first

    @staticmethod
    def _forward(self, x):
        h = x.repeat(*([1] * (x.dim() - 1)), self.reps)[..., :32]
        if self.per_token:
            block = [1] * (h.dim() - 1) + [32]
            s, z = torch.ops.torchao.choose_qparams_affine(h, "ASYMMETRIC", block, torch.int8, -128, 127, None, None,
                                                           torch.int8)
            q = torch.ops.torchao.quantize_affine(h, block, s, z, torch.int8, -128, 127)
            h = torch.ops.torchao.dequantize_affine(q, block, s, z, torch.int8, -128, 127)
        w = torch.ops.torchao.dequantize_affine(self.q, [1, self.group], self.s, self.z, torch.int8, self.lo, self.hi)
        y = F.linear(h, w, self.b)
        if self.epi == "silu":
            return F.silu(y)
        if self.epi == "residual":
            return x + y
        return y


class DynamicQuant(WeightOnly):
    """A dynamically quantized linear (8da4w / 8da8w) as torchao's Int8DynamicActivationIntxWeightConfig
    leaves it: WeightOnly's weight and epilogues, its input quantized per token first
    (choose_qparams_affine -> quantize_affine -> dequantize_affine, int8 asymmetric):
    dynamic_quant_rules' linear_dq{8,4}[_nd][_no_bias][_silu|_residual]."""

    name, family = "dynamic_quant", "dynamic_quant"
    per_token = True


def draw_half(g) -> bool:
    return bool(torch.randint(0, 2, (), generator=g))


class Embedding(Block):
    """A quantized embedding table read at indices computed from x: torchao's dequantize_affine
    (groups of the row) or quantized_decomposed's dequantize_per_channel_group at 2, 4, 8 bits,
    float32 or float16 output (the `.dtype` ops), with zero points `zp`: int8 (True), int8 zeros
    (False: the affine `_nozp` forms; the group form's int8 zero points, whatever their values, are
    embedding_{byte,4bit,2bit}_group_int8_zp's), none (None: the group `_nozp` forms at 4 and 2 bits,
    embedding_byte_group[_dtype] at 8), int8 anywhere in int8 ("wide", one at -128: q - zp leaves
    int8 at 4 and 2 bits) or int32 in the quant range ("int32": the plain group rules at 4 and 2
    bits); and dequantize_per_channel (embedding_byte): embedding_rules. A sink ([*x.shape, D])."""

    name, family = "embedding", "embedding"
    shapes = ((2, 3),)
    FORMS = ("affine", "group", "per_channel")

    def accepts(self, shape):
        return len(shape) in (2, 3)

    def keys(self, shape, quant=False):
        return [3, 3, 2, 5]  # form, bits (2, 4, 8), float16 output, zero points (int8 zeros, int8, none, wide, int32)

    def draw(self, draw, shape, quant=False):
        form, bits, half, zp = super().draw(draw, shape)
        return (self.FORMS[form], (2, 4, 8)[bits], bool(half), (False, True, None, "wide", "int32")[zp])

    D, ROWS = 8, 6

    def build(self, params, shape, g):
        form, bits, half, zp = params
        groups = 2 if form != "per_channel" else 1
        q, s, z, lo, hi = _qweight(g, self.ROWS, self.D, 8 if form == "per_channel" else bits, groups, bool(zp))
        z = None if zp is None else z
        if zp == "wide":  # int8 zero points outside the width's range are legal
            z = torch.randint(-128, 128, z.shape, dtype=torch.int8, generator=g)
            z[0, 0] = -128
        if zp == "int32":  # wider zero points in the quant range: the plain group rules' at 4 and 2 bits
            z = z.to(torch.int32)
        m = _Fn(Embedding._forward)
        m.form, m.bits, m.lo, m.hi = form, bits, lo, hi
        m.out = torch.float16 if half else torch.float32
        m.register_buffer("q", q)
        m.register_buffer("s", s.to(m.out) if form == "group" else s)
        m.register_buffer("z", z)
        if form == "per_channel":
            m.s = s.reshape(-1)
            m.register_buffer("zc", z.reshape(-1).to(torch.int64) if zp else None)
        return m

    @staticmethod
    def _forward(self, x):
        idx = (x.abs() * 3.0).floor().to(torch.int64).remainder(6)
        d = self.q.shape[1]
        if self.form == "affine":
            w = torch.ops.torchao.dequantize_affine(self.q, [1, d // 2], self.s, self.z, torch.int8, self.lo,
                                                    self.hi, output_dtype=self.out)
        elif self.form == "group":
            w = qd.dequantize_per_channel_group.default(self.q, self.s, self.z, self.lo, self.hi, torch.int8, d // 2,
                                                        self.out)
        else:
            w = qd.dequantize_per_channel.default(self.q, self.s, self.zc, 0, -128, 127, torch.int8)
        return F.embedding(idx, w).float()

    def out_shape(self, params, shape):
        return (*shape, self.D)


BLOCKS = {b.name: b for b in (Gemm(), Conv(), Conv1d(), Addmm(), Gated(), Pool(), Attention(), Norm(), Rope(),
                              KVCache(), Permute(), Scale(), Identities(), SymShape(), QuantScalarAdd(), QuantGemm(), WeightOnly(), DynamicQuant(),
                              Embedding())}


def key_combinations(block: Block, shape, quant: bool = False):
    return list(itertools.product(*(range(n) for n in block.keys(shape, quant))))


def apply_shape_hint(shape) -> tuple:
    return tuple(shape)


__all__ = ["ACTS", "BLOCKS", "Block", "ForcedDraw", "key_combinations", "act", "math"]
