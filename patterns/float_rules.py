"""Float fusions: an activation absorbed by the op that produces its input.

| rule                | edge pattern                                        | backend op          |
|---------------------|-----------------------------------------------------|---------------------|
| add_relu            | relu(add(self, other))  (commutative, broadcasting) | etfuse::add_relu    |
| addmm_relu          | relu(addmm(self, mat1, mat2))                       | etfuse::addmm_relu  |

`relu` of an `nn.Linear` (`etfuse::linear_relu`) is a GEMM epilogue: its rules live in
gemm_conv_rules.py and outrank `addmm_relu` there.
"""

import torch

from etfuse.backend_ops import ADD_RELU, ADDMM_RELU

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
]
