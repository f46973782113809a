"""PT2E-quantized conv2d and linear (XNNPACK quantizer: per-tensor activations, per-channel int8
weights, float bias) into `etfuse::quantized_conv2d` / `etfuse::quantized_linear`.

| rule                          | edge pattern                                                          |
|-------------------------------|-----------------------------------------------------------------------|
| quantized_conv2d              | q(conv(dq(x), dq_per_channel(w), bias))                               |
| quantized_conv2d_relu         | q(relu(conv(...)))                                                    |
| quantized_conv2d_hardtanh     | q(hardtanh(conv(...), lo, hi))                                        |
| quantized_conv2d_requant_relu | q2(relu(dq1(q1(conv(...)))))          q1 and q2 with the same qparams |
| quantized_conv2d_requant_hardtanh | q2(hardtanh(dq1(q1(conv(...))), lo, hi))  (how the XNNPACK quantizer leaves relu6) |
| quantized_linear[...][_no_bias] | the same around `linear` (edge: addmm / mm of permute_copy(w))      |

The activation becomes the op's output range: quantize is monotonic, so quantize(clamp(y, lo,
hi)) = clamp(quantize(y), quantize(lo), quantize(hi)), and quantize(dequantize(v)) = v for the
same qparams; both exactly, in float32 (backend_ops/quantized_gemm_ops.py). Activations and the
output share one dtype (int8 or uint8); the weight is int8 along dim 0 (axis 0).
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from etfuse.backend_ops.quantized_gemm_ops import QUANTIZED_CONV2D, QUANTIZED_LINEAR

from .constraints import all_of, int_scalars, ranks, tensors
from .quant_rules import QuantRule, qparams_check, same_dtypes
from .rule import Match

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
I8, U8, I16, I32 = torch.int8, torch.uint8, torch.int16, torch.int32

# Example scalars, each distinct from every other scalar and literal of the patterns (0 is the
# per-channel axis, -127/127 no one's).
_X = dict(x_scale=0.11, x_zero_point=13, x_quant_min=11, x_quant_max=250)
_W = dict(w_quant_min=-126, w_quant_max=125)
_CONV = dict(s0=2, s1=3, p0=4, p1=5, d0=9, d1=7, groups=8)
_MID = dict(mid_scale=0.19, mid_zero_point=19, mid_quant_min=-29000, mid_quant_max=29000)
_OUT = dict(out_scale=0.17, out_zero_point=17, out_quant_min=-30000, out_quant_max=30000)
_LO, _HI = -2.5, 3.5
_DTYPES = {"x_dtype": U8, "out_dtype": I16}
_MID_DTYPES = {**_DTYPES, "mid_dtype": I32}


def _dq(x, x_scale, x_zero_point, x_quant_min, x_quant_max, x_dtype):
    return qd.dequantize_per_tensor.default(x, x_scale, x_zero_point, x_quant_min, x_quant_max, x_dtype)


def _dq_weight(w, w_scale, w_zero_point, w_quant_min, w_quant_max):
    return qd.dequantize_per_channel.default(w, w_scale, w_zero_point, 0, w_quant_min, w_quant_max, I8)


def _q(y, scale, zero_point, quant_min, quant_max, dtype):
    return qd.quantize_per_tensor.default(y, scale, zero_point, quant_min, quant_max, dtype)


def _act(act: str, y, lo, hi):
    if act == "relu":
        return aten.relu.default(y)
    if act == "hardtanh":
        return aten.hardtanh.default(y, lo, hi)
    return y


def _pattern(kind: str, act: str, requant: bool, bias: bool):
    """One pattern function per (conv2d | linear, activation, q/dq before it, bias)."""

    def body(x, x_scale, x_zero_point, x_quant_min, x_quant_max, w, w_scale, w_zero_point, w_quant_min, w_quant_max,
             bias, conv, out_scale, out_zero_point, out_quant_min, out_quant_max, lo, hi, mid, x_dtype, out_dtype,
             mid_dtype):
        xf = _dq(x, x_scale, x_zero_point, x_quant_min, x_quant_max, x_dtype)
        wf = _dq_weight(w, w_scale, w_zero_point, w_quant_min, w_quant_max)
        if kind == "conv2d":
            s0, s1, p0, p1, d0, d1, groups = conv
            y = aten.convolution.default(xf, wf, bias, [s0, s1], [p0, p1], [d0, d1], False, [0, 0], groups)
        else:
            y = aten.linear.default(xf, wf, bias)
        if requant:
            y = _dq(_q(y, *mid, mid_dtype), *mid, mid_dtype)
        return _q(_act(act, y, lo, hi), out_scale, out_zero_point, out_quant_min, out_quant_max, out_dtype)

    names = ["x", *_X, "w", "w_scale", "w_zero_point", *_W] + (["bias"] if bias else [])
    names += list(_CONV) if kind == "conv2d" else []
    names += [*_MID] if requant else []
    names += [*_OUT] + (["lo", "hi"] if act == "hardtanh" else [])
    dtypes = _MID_DTYPES if requant else _DTYPES

    def pattern(*args, **kwargs):
        b = dict(zip(names, args), **kwargs)
        conv = tuple(b[k] for k in _CONV) if kind == "conv2d" else None
        mid = tuple(b[k] for k in ("mid_scale", "mid_zero_point", "mid_quant_min", "mid_quant_max")) if requant else None
        return body(b["x"], *(b[k] for k in _X), b["w"], b["w_scale"], b["w_zero_point"], *(b[k] for k in _W),
                    b.get("bias"), conv, *(b[k] for k in _OUT), b.get("lo"), b.get("hi"), mid,
                    b.get("x_dtype", dtypes["x_dtype"]), b.get("out_dtype", dtypes["out_dtype"]),
                    b.get("mid_dtype", dtypes.get("mid_dtype")))

    pattern.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d) for n, d in dtypes.items()])
    return pattern


def _examples(kind: str, act: str, requant: bool, bias: bool):
    def make():
        if kind == "conv2d":  # 8 channels in groups of 8: the weight [16, 1, 3, 3]
            x, w, n = torch.zeros(1, 8, 40, 40, dtype=U8), torch.ones(16, 1, 3, 3, dtype=I8), 16
        else:
            x, w, n = torch.zeros(4, 8, dtype=U8), torch.ones(16, 8, dtype=I8), 16
        args = [x, *_X.values(), w, torch.full((n,), 0.01), torch.zeros(n, dtype=torch.int64), *_W.values()]
        args += [torch.zeros(n)] if bias else []
        args += list(_CONV.values()) if kind == "conv2d" else []
        args += list(_MID.values()) if requant else []
        args += list(_OUT.values()) + ([_LO, _HI] if act == "hardtanh" else [])
        return tuple(args)

    return make


# ---- constraints ------------------------------------------------------------------------------

def _same_qparams(m: Match) -> Optional[str]:
    """The requantize in between is an identity only when it uses the output's scale and zero point."""
    b = m.bindings
    mid, out = (b["mid_scale"], b["mid_zero_point"]), (b["out_scale"], b["out_zero_point"])
    if mid != out:
        return (f"the quantize before the activation has scale/zero point {mid}, the one after it {out}: "
                "only the same qparams fold into one requantization")
    return None


def _weight(kind: str):
    rank = 4 if kind == "conv2d" else 2

    def check(m: Match) -> Optional[str]:
        w, scale, zp = m.value("w"), m.value("w_scale"), m.bindings["w_zero_point"]
        n = w.shape[0]
        if scale.dim() != 1 or scale.shape[0] != n or not scale.dtype.is_floating_point:
            return f"w_scale is {scale.dtype} {tuple(scale.shape)}; the kernel takes one float scale per output channel ({n})"
        if zp is not None:
            z = m.value("w_zero_point")
            if z.dim() != 1 or z.shape[0] != n or z.dtype.is_floating_point or z.dtype == torch.bool:
                return f"w_zero_point is {z.dtype} {tuple(z.shape)}; the kernel takes one integer per output channel ({n})"
        return None

    return all_of(tensors(["w"], (I8,)), ranks(w=rank), check)


def _input(kind: str):
    return all_of(tensors(["x"], (I8, U8)), ranks(x=4 if kind == "conv2d" else 2))


def _bounds(m: Match) -> Optional[str]:
    lo, hi = m.bindings.get("lo"), m.bindings.get("hi")
    for v in (lo, hi):
        if v is not None and (isinstance(v, (torch.fx.Node, bool)) or not isinstance(v, (int, float))):
            return f"hardtanh bound {v!r} is not a constant number"
    if lo is not None and hi is not None and float(lo) > float(hi):
        return f"hardtanh min {lo} > max {hi}"
    return None


def _check(kind: str, requant: bool):
    checks = [same_dtypes("x_dtype", "out_dtype", *(("mid_dtype",) if requant else ())),
              qparams_check("x", "x_dtype"), qparams_check("out", "out_dtype"), _input(kind), _weight(kind), _bounds]
    if requant:
        checks += [qparams_check("mid", "mid_dtype"), _same_qparams]
    checks += [int_scalars(_CONV), _bias_shape] if kind == "conv2d" else [_bias_shape]
    return all_of(*checks)


def _bias_shape(m: Match) -> Optional[str]:
    if m.bindings.get("bias") is None:
        return None
    b, n = m.value("bias"), m.value("w").shape[0]
    if b.dtype != torch.float32 or b.dim() != 1 or b.shape[0] != n:
        return f"bias is {b.dtype} {tuple(b.shape)}; the kernel takes float32 [{n}]"
    return None



# ---- the op's output range ------------------------------------------------------------------

def _quantize_scalar(v: float, scale: float, zero_point: int, qmin: int, qmax: int) -> int:
    """quantize_per_tensor of one float32 value, as the kernels compute it."""
    t = torch.tensor([v], dtype=torch.float32)
    return int(torch.clamp(torch.round(t * (1.0 / scale)) + zero_point, qmin, qmax).item())


def output_range(act: str, b: dict) -> tuple[int, int]:
    lo, hi = b["out_quant_min"], b["out_quant_max"]
    if "mid_quant_min" in b:  # the requantize in between clamps too
        lo, hi = max(lo, b["mid_quant_min"]), min(hi, b["mid_quant_max"])
    q = lambda v: _quantize_scalar(v, b["out_scale"], b["out_zero_point"], b["out_quant_min"], b["out_quant_max"])  # noqa: E731
    if act == "relu":
        lo = max(lo, q(0.0))
    elif act == "hardtanh":
        lo, hi = max(lo, q(float(b["lo"]))), min(hi, q(float(b["hi"])))
    return lo, max(lo, hi)  # an empty range (hardtanh above the quant range) is the one value lo


def _arguments(kind: str, act: str):
    def arguments(m: Match):
        b = m.bindings
        lo, hi = output_range(act, b)
        args = [b["x"], b["x_scale"], b["x_zero_point"], b["w"], b["w_scale"], b["w_zero_point"], b.get("bias")]
        if kind == "conv2d":
            args += [[b["s0"], b["s1"]], [b["p0"], b["p1"]], [b["d0"], b["d1"]], b["groups"]]
        return (*args, b["out_scale"], b["out_zero_point"], lo, hi), {}

    return arguments


def _rules():
    rules = []
    for kind, op in (("conv2d", QUANTIZED_CONV2D), ("linear", QUANTIZED_LINEAR)):
        for act, requant in (("relu", True), ("hardtanh", True), ("relu", False), ("hardtanh", False),
                             ("none", False)):
            for bias in ((True,) if kind == "conv2d" else (True, False)):
                name = f"quantized_{kind}" + ("_requant" if requant else "") + ("" if act == "none" else f"_{act}")
                name += "" if bias else "_no_bias"
                rules.append(QuantRule(name, _pattern(kind, act, requant, bias), op,
                                       _examples(kind, act, requant, bias), _check(kind, requant),
                                       _arguments(kind, act), dtypes=_MID_DTYPES if requant else _DTYPES))
    return rules


QUANTIZED_GEMM_RULES = _rules()
