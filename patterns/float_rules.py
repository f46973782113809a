"""Float fusions: an activation absorbed by the op that produces its input.

| rule                | edge pattern                                        | backend op          |
|---------------------|-----------------------------------------------------|---------------------|
| add_relu            | relu(add(self, other))  (commutative, broadcasting) | etfuse::add_relu    |
| addmm_relu          | relu(addmm(self, mat1, mat2))                       | etfuse::addmm_relu  |
| mul_channels        | mul(x [N, C, H, W], s [N or 1, C, 1, 1]) (commutative) | etfuse::mul      |
| mul_rows            | mul(x [..., C], s [C]) (commutative)                | etfuse::mul         |
| add_rows            | add(x [..., C], b [C]) (commutative)                | etfuse::add         |

`mul_channels` is a squeeze-excite block's scale (and any per-channel gate): the portable `mul`
walks a broadcast element by element, about 25x slower than a flat loop per channel plane.
`mul_rows` / `add_rows` are the same broadcast along the last dim: MobileBERT's NoNorm
(`x * weight + bias` after every bottleneck and feed-forward linear). Other additions and
multiplications (same shapes: the portable kernel's flat loop) stay with the portable kernel.

`relu` of an `nn.Linear` (`etfuse::linear_relu`) is a GEMM epilogue: its rules live in
gemm_conv_rules.py and outrank `addmm_relu` there.
"""

import torch

from etfuse.backend_ops import ADD, ADD_RELU, ADDMM_RELU, MUL

from .constraints import all_of, output_dtype, ranks, tensors
from .rule import Rule

aten = torch.ops.aten
F32 = (torch.float32,)


def _matmul_shapes(m):
    # addmm's self must broadcast to [M, N]: the kernel reads it as a row, a column or a matrix.
    if "self" in m.bindings:
        v = m.value("self")
        if v.dim() > 2:
            return f"self has rank {v.dim()}; addmm_relu broadcasts a rank <= 2 bias"
    return None


def _channel_scale(m):
    # one operand [N, C, H, W], the other one value per (image, channel) plane, H * W > 1
    a, b = m.value("self"), m.value("other")
    if a.dim() != 4 or b.dim() != 4:
        return f"operands of rank {a.dim()} and {b.dim()}; mul_channels takes [N, C, H, W] and [N or 1, C, 1, 1]"
    if tuple(b.shape[2:]) != (1, 1):
        a, b = b, a
    n, c, h, w = a.shape
    if tuple(b.shape[1:]) != (c, 1, 1) or b.shape[0] not in (1, n) or h * w == 1:
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)} are not a per-channel scale"
    return None


def _row_vector(m):
    # one operand [..., C] of rank >= 2, the other [C] (one value per feature, broadcast over rows)
    a, b = m.value("self"), m.value("other")
    if b.dim() > a.dim():
        a, b = b, a
    if a.dim() < 2 or b.dim() != 1 or b.shape[0] != a.shape[-1] or a.shape[-1] == a.numel():
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)} are not a per-feature row vector"
    return None


FLOAT_RULES = [
    Rule.for_op(
        ADD_RELU,
        example_inputs=lambda: (torch.randn(4, 8), torch.randn(4, 8)),
        constraint=all_of(tensors(["self", "other"], F32), output_dtype(torch.float32)),
    ),
    Rule.for_op(
        ADDMM_RELU,
        example_inputs=lambda: (torch.randn(16), torch.randn(4, 8), torch.randn(8, 16)),
        constraint=all_of(tensors(["self", "mat1", "mat2"], F32), ranks(mat1=2, mat2=2), _matmul_shapes),
    ),
    Rule.for_op(
        MUL, name="mul_channels",
        example_inputs=lambda: (torch.randn(2, 8, 5, 5), torch.randn(2, 8, 1, 1)),
        constraint=all_of(tensors(["self", "other"], F32), output_dtype(torch.float32), _channel_scale),
    ),
    Rule.for_op(
        MUL, name="mul_rows",
        example_inputs=lambda: (torch.randn(2, 5, 8), torch.randn(8)),
        constraint=all_of(tensors(["self", "other"], F32), output_dtype(torch.float32), _row_vector),
    ),
    Rule.for_op(
        ADD, name="add_rows",
        example_inputs=lambda: (torch.randn(2, 5, 8), torch.randn(8)),
        constraint=all_of(tensors(["self", "other"], F32), output_dtype(torch.float32), _row_vector),
    ),
]
