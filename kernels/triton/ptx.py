"""Ahead-of-time compilation of every Triton kernel for a GPU target, without a GPU.

`compile_all(arch=90)` compiles each specialisation the launchers use (per dtype and
constexpr choice, mirroring launch.py) with
`triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` and returns
{name: compiled kernel} (`.asm["ptx"]`, `.asm["cubin"]`). Like the runtime launcher for
the usual tensors, every pointer (and the sizes/strides named per kernel) is declared 16-byte
/ 16-element divisible (`tt.divisibility`), so the PTX shows the vectorised loads a real
launch gets. CI runs it so that a
kernel that would not build for sm_90 fails there; `python -m etfuse.kernels.triton.ptx`
prints a summary.
"""

from __future__ import annotations

import sys
from typing import Iterator

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import _jit

_PTR = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "int8": "*i8", "uint8": "*u8",
        "int32": "*i32", "int64": "*i64"}
# Launch options each kernel is launched with (launch.py); enable_fp_fusion=False keeps
# the quantized arithmetic free of FMA contraction.
_QUANT_OPTIONS = {"enable_fp_fusion": False, "num_warps": 4}


def _ints(names, ty="i64"):
    return {n: ty for n in names}


_EW_INTS = ("n", "s1", "s2", "s3", "sa0", "sa1", "sa2", "sa3", "sb0", "sb1", "sb2", "sb3")


def _div16(kernel, signature: dict, ints=()) -> dict:
    """tt.divisibility=16 for every pointer argument and the named integer ones."""
    names = [n for n, t in signature.items() if t.startswith("*")] + list(ints)
    return {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def specs() -> Iterator[tuple[str, object, dict, dict, dict, dict]]:
    """(name, kernel, signature, constexprs, options, attrs) for every specialisation."""
    for name, kernel, sig, cx, opts, ints in _specs():
        yield name, kernel, sig, cx, opts, _div16(kernel, sig, ints)


def _specs():
    for dt in ("float32", "float16", "bfloat16"):
        for contig in (True, False):
            sig = {"a_ptr": _PTR[dt], "b_ptr": _PTR[dt], "o_ptr": _PTR[dt], **_ints(_EW_INTS),
                   "CONTIG": "constexpr", "BLOCK": "constexpr"}
            yield (f"add_relu[{dt},{'contig' if contig else 'bcast'}]", _jit.add_relu_kernel, sig,
                   {"CONTIG": contig, "BLOCK": 1024 if dt == "float32" else 2048}, {"num_warps": 4}, ("n",))
    for dt in ("int8", "uint8"):
        for relu in (False, True):
            for contig in (True, False):
                sig = {"a_ptr": _PTR[dt], "b_ptr": _PTR[dt], "o_ptr": _PTR[dt], **_ints(_EW_INTS),
                       **{k: "fp32" for k in ("a_scale", "a_zp", "b_scale", "b_zp", "inv_out_scale", "out_zp",
                                              "qmin", "qmax")},
                       "RELU": "constexpr", "CONTIG": "constexpr", "BLOCK": "constexpr"}
                yield (f"quantized_{'add_relu' if relu else 'add'}[{dt},{'contig' if contig else 'bcast'}]",
                       _jit.quantized_add_kernel, sig, {"RELU": relu, "CONTIG": contig, "BLOCK": 4096},
                       dict(_QUANT_OPTIONS), ("n",))
    # Operand layouts as launched: linear_relu reads weight [N, K] as b with s_bk = 1;
    # addmm_relu a contiguous mat2 [K, N] with s_bn = 1; the output and the bias row have unit
    # column stride (an int argument equal to 1 is specialised to a constant at launch).
    layouts = {"linear": {"s_ak": 1, "s_bk": 1, "s_biasn": 1, "s_cn": 1},
               "addmm": {"s_ak": 1, "s_bn": 1, "s_biasn": 1, "s_cn": 1}}
    for dt, prec, tile in (("float16", "tf32", (128, 256, 64, 8, 3)), ("bfloat16", "tf32", (128, 128, 64, 8, 3)),
                           ("float32", "ieee", (128, 128, 32, 8, 3)), ("float32", "tf32", (64, 64, 32, 4, 3))):
        for layout, has_bias, even_k in (("linear", True, True), ("addmm", True, False), ("linear", False, False)):
            bm, bn, bk, warps, stages = tile
            unit = layouts[layout]
            ints = [n for n in ("M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_biasm", "s_biasn", "s_cm", "s_cn")
                    if n not in unit]
            sig = {"a_ptr": _PTR[dt], "b_ptr": _PTR[dt], "bias_ptr": _PTR[dt], "c_ptr": _PTR[dt],
                   **{n: ("constexpr" if n in unit else "i64")
                      for n in ("M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_biasm", "s_biasn", "s_cm", "s_cn")},
                   **{k: "constexpr" for k in ("HAS_BIAS", "EVEN_K", "INPUT_PRECISION", "BLOCK_M", "BLOCK_N",
                                               "BLOCK_K", "GROUP_M")}}
            yield (f"addmm_relu[{dt},{prec},{bm}x{bn}x{bk},{layout},{'bias' if has_bias else 'nobias'},"
                   f"{'evenK' if even_k else 'maskK'}]", _jit.addmm_relu_kernel, sig,
                   {**unit, "HAS_BIAS": has_bias, "EVEN_K": even_k, "INPUT_PRECISION": prec, "BLOCK_M": bm,
                    "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, {"num_warps": warps, "num_stages": stages},
                   [n for n in ints if n != "s_biasm"] if even_k else [n for n in ("s_am", "s_bn", "s_bk", "s_cm")
                                                                     if n in ints])
    for wt in ("int8", "uint8"):
        for ot in ("float32", "float16"):
            for idt in ("int64", "int32"):
                for has_zp in (True, False):
                    sig = {"w_ptr": _PTR[wt], "scale_ptr": _PTR[ot], "zp_ptr": "*i64" if has_zp else _PTR[ot],
                           "idx_ptr": _PTR[idt],
                           "o_ptr": _PTR[ot], **_ints(("n_idx", "rows", "D", "s_w0")),
                           # a contiguous weight: the launcher specialises an int argument of 1
                           "s_w1": "constexpr",
                           "HAS_ZP": "constexpr", "BLOCK_R": "constexpr", "BLOCK_D": "constexpr"}
                    yield (f"embedding_byte[{wt}->{ot},{idt},{'zp' if has_zp else 'nozp'}]",
                           _jit.embedding_byte_kernel, sig, {"s_w1": 1, "HAS_ZP": has_zp, "BLOCK_R": 16, "BLOCK_D": 256},
                           dict(_QUANT_OPTIONS), ("D", "s_w0"))


def compile_one(kernel, signature: dict, constexprs: dict, options: dict, attrs: dict = None, arch: int = 90):
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_all(arch: int = 90, only: str = "") -> dict:
    return {name: compile_one(k, sig, cx, opts, attrs, arch) for name, k, sig, cx, opts, attrs in specs() if only in name}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    arch = int(argv[0]) if argv else 90
    for name, c in compile_all(arch).items():
        ptx = c.asm["ptx"]
        print(f"{name}: ptx {len(ptx)} chars, cubin {len(c.asm.get('cubin', b''))} bytes, "
              f"fma {ptx.count('fma.rn')}, 128-bit loads {ptx.count('ld.global.v4')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
