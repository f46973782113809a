"""PrepackWeightsPass: constant weights packed once, at fuse time, for the GEMM's tiles.

`linear_act` / `linear_relu` pack their [out, in] weight into the GEMM's 16-column panels on
every call, and conv2d on a small output map runs the transposed problem whose B is the weight
(kernels/csrc/core/gemm.h, conv2d.h). On a program with its values, this pass rewrites

    linear_act(x, w, b, min, max, act, residual)   (linear_relu: min 0)
        -> linear_packed_act(x, pack_gemm_weight(w), out_features, b, min, max, act, residual)
    conv2d_act(x, w, b, stride, padding, dilation, 1, ..., residual)          (and conv2d_bn_act)
        -> conv2d_packed_act(x, pack_gemm_weight(w), w.shape, b, stride, padding, dilation, ..., residual)

    quantized_linear(x, ..., w, w_scale, w_zp, ...)  (and quantized_conv2d, same map rule)
        -> quantized_linear_packed(x, ..., pack_gemm_weight(w), out_features, w_scale, ...)

(the int8 weight packed as it is, so the .pte keeps one byte a weight; only where the weight
zero points are absent or known to be all 0), where the weight is a constant (parameter,
buffer, lifted constant), and folds
`pack_gemm_weight` into a program constant (backend_ops/prepacked_ops.py): the runtime reads the
panels in place. A weight shared by several ops is packed once; the unpacked weight goes when
nothing else reads it. Where it applies (measured with the eager `.out` kernels, 2 threads,
unpacked -> packed):

* linears with MIN_ROWS rows or more: 1024x1024 at 3 rows 77 -> 71 us, 5 rows 107 -> 80,
  37x768x768 417 -> 290. One row (decode) stays unpacked: the dot-product path reads the weight
  as stored, 42 us vs 59 packed. Symbolic rows (a dynamic sequence length, executorch's llama
  export's default, there for prefill) are packed unless their range keeps them under MIN_ROWS:
  the packed kernel takes any row count at run time (gemm.h's tiles, rows from the input), and
  the weight is packed once whatever the length. The price: the one-row calls of such a program
  (decode steps through the same method) run the packed tiles, not the dot-product path;
* convs below: their output map (H, W) static, any batch;
* 1x1 convs (groups 1) with fewer than MAX_CONV_PIXELS output pixels: 160 -> 960 on 7x7 479 ->
  147 us, on 3x3 82 -> 46; on the runtime (8-layer chains with batch norm, 2 threads, us,
  unpacked -> packed) 64 -> 64 on 12x12 106 -> 97, 96 -> 96 on 12x12 181 -> 172, 64 -> 64 on
  11x11 105 -> 95, 128 -> 128 on 10x10 235 -> 207; DS-CNN (four 64 -> 64 on 25x5) 102 -> 98.5.
  From 16x16 on the implicit GEMM, reading the input planes in place, is as fast or faster
  (64 -> 64 on 16x16 166 vs 168; 32 -> 32 on 24x24 120 vs 134) and it stays, as do depthwise
  and grouped convs.
* spatial (3x3) float convs (groups 1) on maps under 4x4, and under 8x8 with 128 output channels
  or more: the packed op runs the GEMM's tiles over the image's im2col, pixels as rows, and fills
  them where the unpacked op's GEMM over phase planes (pixels as columns, 32 to a panel with
  AVX-512) leaves most of a panel empty. Measured on one AVX-512 thread (us, unpacked -> packed):
  512 -> 512 on 3x3 1149 -> 538, 256 -> 512 stride 2 to 3x3 565 -> 246, 256 -> 256 on 6x6 541 ->
  401, 128 -> 128 on 6x6 130 -> 112; with fewer channels the unpacked op wins (64 -> 64 on 8x8 44
  vs 66, 32 -> 32 on 7x7 17 vs 20).
  int8 convs keep packing their 3x3s (the unpacked int8 op converts the weight every call), on
  maps under MAX_INT8_CONV_PIXELS (8x8). On CPUs with AVX-512 VNNI the int8 kernels regroup the
  panels per call (docs/performance.md); there not packing measured even on MobileNetV2, and the
  packing pays on CPUs without it, so it stays.

Like FoldPackedWeightsPass it works on a copy; given a graph module alone
(`ExecutorchBackendConfig(passes=...)`) there are no values, and it returns a copy unchanged.
Only the top-level graph is visited: an op inside a control-flow body reads its weight as a
body input, not as a constant.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from executorch.exir.pass_base import ExportedProgramPassResult
from executorch.exir.passes.constant_prop_pass import get_constant_placeholder_dict

from etfuse.backend_ops import (CONV2D_ACT, CONV2D_BN_ACT, CONV2D_BN_PACKED_ACT, CONV2D_PACKED_ACT, LINEAR_ACT,
                                LINEAR_PACKED_ACT, LINEAR_RELU, PACK_GEMM_WEIGHT, QUANTIZED_CONV2D,
                                QUANTIZED_CONV2D_PACKED, QUANTIZED_LINEAR, QUANTIZED_LINEAR_PACKED)

from .engine import _aten
from .fold_packed_weights import fold_only
from .graph_copy import ValuesPass, editable_copy

MIN_ROWS = 3
MAX_CONV_PIXELS = 256  # exclusive: from 16x16 on, the implicit GEMM reads its panels in place
MAX_INT8_CONV_PIXELS = 64  # int8 convs, any kernel size: measured up to 8x8 maps only
# spatial float kernels: under conv2d.h's kPhaseMinPixels always, under 8x8 from 128 output channels
MIN_PHASE_PIXELS, MAX_SPATIAL_PACK_PIXELS, MIN_SPATIAL_PACK_COUT = 16, 64, 128


def _val(arg):
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _linear_worth_it(node: fx.Node, args: dict, constants: dict) -> bool:
    x = _val(args["input"])
    if x is None or x.dim() < 1:
        return False
    # symbolic rows (a dynamic sequence length): packed unless they provably stay under MIN_ROWS
    return not statically_known_true(math.prod(x.shape[:-1]) < MIN_ROWS)


def _conv_worth_it(node: fx.Node, args: dict, constants: dict, max_pixels: int) -> bool:
    out = _val(node)
    # the map decides (below); the batch, which may be symbolic, does not
    return (args["groups"] == 1 and out is not None and out.dim() == 4 and _static(out.shape[2:])
            and out.shape[2] * out.shape[3] < max_pixels)


def _float_conv_worth_it(node: fx.Node, args: dict, constants: dict) -> bool:
    weight, out = _val(args["weight"]), _val(node)
    if not (_conv_worth_it(node, args, constants, MAX_CONV_PIXELS) and weight is not None):
        return False
    if tuple(weight.shape[2:]) == (1, 1):
        return True
    # a spatial kernel: where the unpacked op's GEMM over phase planes fills its pixel panels
    # badly (module docstring)
    pixels = out.shape[2] * out.shape[3]
    return pixels < MIN_PHASE_PIXELS or (pixels < MAX_SPATIAL_PACK_PIXELS and weight.shape[0] >= MIN_SPATIAL_PACK_COUT)


def _optional_residual(args: dict) -> tuple:
    residual = args.get("residual")
    return () if residual is None else (residual,)


def _packed_linear_args(args: dict, packed: fx.Node, weight) -> tuple:
    return (args["input"], packed, weight.shape[0], args.get("bias"), args.get("min"), args.get("max"),
            args.get("activation", "none"), *_optional_residual(args))


def _packed_conv_args(args: dict, packed: fx.Node, weight) -> tuple:
    return (args["input"], packed, list(weight.shape), args["bias"], args["stride"], args["padding"], args["dilation"],
            args.get("min"), args.get("max"), args.get("activation", "none"), *_optional_residual(args))


def _packed_conv_bn_args(args: dict, packed: fx.Node, weight) -> tuple:
    return (args["input"], packed, list(weight.shape), args["bias"], args["bn_weight"], args["bn_bias"],
            args["running_mean"], args["running_var"], args["eps"], args["stride"], args["padding"],
            args["dilation"], args.get("min"), args.get("max"), args.get("activation", "none"),
            *_optional_residual(args))


def _symmetric(args: dict, constants: dict) -> bool:
    """A quantized op's weight zero points are absent or all 0 (the packed ops take none)."""
    zp = args.get("weight_zero_point")
    if zp is None:
        return True
    value = constants.get(zp) if isinstance(zp, fx.Node) else None
    return isinstance(value, torch.Tensor) and not bool(value.any())


def _quantized_linear_worth_it(node: fx.Node, args: dict, constants: dict) -> bool:
    # any rows: the unpacked op converts the whole int8 weight to floats on every call
    return _symmetric(args, constants)


def _quantized_conv_worth_it(node: fx.Node, args: dict, constants: dict) -> bool:
    return _symmetric(args, constants) and _conv_worth_it(node, args, constants, MAX_INT8_CONV_PIXELS)


def _packed_quantized_linear_args(args: dict, packed: fx.Node, weight) -> tuple:
    return (args["input"], args["input_scale"], args["input_zero_point"], packed, weight.shape[0],
            args["weight_scale"], args.get("bias"), args["output_scale"], args["output_zero_point"],
            args["output_min"], args["output_max"])


def _packed_quantized_conv_args(args: dict, packed: fx.Node, weight) -> tuple:
    return (args["input"], args["input_scale"], args["input_zero_point"], packed, list(weight.shape),
            args["weight_scale"], args.get("bias"), args["stride"], args["padding"], args["dilation"],
            args["output_scale"], args["output_zero_point"], args["output_min"], args["output_max"])


# op -> (its packed op, whether packing pays at this node, the packed op's arguments, the weight's dtype)
_PACKABLE = {
    LINEAR_ACT.aten: (LINEAR_PACKED_ACT, _linear_worth_it, _packed_linear_args, torch.float32),
    LINEAR_RELU.aten: (LINEAR_PACKED_ACT, _linear_worth_it,
                       lambda args, packed, w: _packed_linear_args({**args, "min": 0.0}, packed, w), torch.float32),
    CONV2D_ACT.aten: (CONV2D_PACKED_ACT, _float_conv_worth_it, _packed_conv_args, torch.float32),
    CONV2D_BN_ACT.aten: (CONV2D_BN_PACKED_ACT, _float_conv_worth_it, _packed_conv_bn_args, torch.float32),
    # int8 panels: the .pte keeps 1 byte a weight
    QUANTIZED_LINEAR.aten: (QUANTIZED_LINEAR_PACKED, _quantized_linear_worth_it, _packed_quantized_linear_args,
                            torch.int8),
    QUANTIZED_CONV2D.aten: (QUANTIZED_CONV2D_PACKED, _quantized_conv_worth_it, _packed_quantized_conv_args,
                            torch.int8),
}


def _named_args(node: fx.Node) -> dict:
    """The node's arguments by schema name (positional and keyword)."""
    names = [a.name for a in _aten(node.target)._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _packable(node: fx.Node, constants: dict) -> bool:
    if node.op != "call_function" or _aten(node.target) not in _PACKABLE:
        return False
    args = _named_args(node)
    value = constants.get(args["weight"]) if isinstance(args["weight"], fx.Node) else None
    _, worth_it, _, dtype = _PACKABLE[_aten(node.target)]
    return isinstance(value, torch.Tensor) and value.dtype == dtype and worth_it(node, args, constants)


def _is_pack(target) -> bool:
    return _aten(target) == PACK_GEMM_WEIGHT.aten


class PrepackWeightsPass(ValuesPass):
    """linear / conv2d ops on constant weights -> their *_packed_act forms on packed constants."""

    def call(self, ep) -> ExportedProgramPassResult:
        constants = get_constant_placeholder_dict(ep)
        names = {n.name for n in ep.graph.nodes if _packable(n, constants)}
        if not names:
            return ExportedProgramPassResult(ep, False)
        new = editable_copy(ep)
        graph = new.graph
        packs: dict[fx.Node, fx.Node] = {}  # weight -> its pack node: a shared weight is packed once
        for node in list(graph.nodes):
            if node.name not in names:
                continue
            args = _named_args(node)
            weight = args["weight"]
            if weight not in packs:
                with graph.inserting_after(weight):
                    pack = graph.call_function(PACK_GEMM_WEIGHT.backend, (weight,))
                fake = weight.meta["val"]
                with fake.fake_mode:
                    pack.meta["val"] = PACK_GEMM_WEIGHT.aten(fake)
                packs[weight] = pack
            packed_op, _, packed_args, _ = _PACKABLE[_aten(node.target)]
            with graph.inserting_before(node):
                fused = graph.call_function(packed_op.backend, packed_args(args, packs[weight], weight.meta["val"]))
            fused.meta = dict(node.meta)
            node.replace_all_uses_with(fused)
            graph.erase_node(node)
        new.graph_module.recompile()
        new = fold_only(new, _is_pack)
        left = [n.name for n in new.graph.nodes if n.op == "call_function" and _is_pack(n.target)]
        if left:
            raise RuntimeError(f"PrepackWeightsPass: pack_gemm_weight not folded into a constant at {left}")
        return ExportedProgramPassResult(new, True)
