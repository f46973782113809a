"""etfuse::permute_copy (backend_ops/layout_ops.py, kernels/csrc/ops/permute_copy.cpp,
patterns/layout_rules.py): the kernel against torch (dtypes, ranks, strided inputs) and the rules
on a channel shuffle (exact ops; eager, runtime and retrace equal to eager)."""

from __future__ import annotations

import pytest
import torch

import etfuse
from etfuse.backend_ops import PERMUTE_COPY
from fusion_helpers import edge_program, op_names

pytestmark = pytest.mark.usefixtures("eager_kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.bool], ids=str)
@pytest.mark.parametrize("shape, dims", [((1, 16, 6, 48), [0, 2, 1, 3]), ((3, 4, 5), [2, 0, 1]), ((7, 9), [1, 0]),
                                         ((2, 3, 4, 5, 6), [4, 3, 2, 1, 0]), ((1, 1, 5), [2, 1, -3]),
                                         ((2, 0, 3), [1, 2, 0])], ids=str)
def test_kernel_is_torch_permute(shape, dims, dtype):
    x = (torch.randn(shape) * 3).to(dtype)
    for src in (x, x.transpose(0, -1).contiguous().transpose(0, -1)):
        got = torch.ops.etfuse.permute_copy.out(src, dims, out=torch.empty(0, dtype=dtype))
        assert torch.equal(got, src.permute(dims)) and got.is_contiguous()


def test_bad_dims_are_named_and_opcheck(opcheck):
    with pytest.raises(RuntimeError, match=r"etfuse::permute_copy.out: dims is not a permutation"):
        torch.ops.etfuse.permute_copy.out(torch.randn(2, 3), [0, 0], out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"dims has 3 entries for a tensor of rank 2"):
        torch.ops.etfuse.permute_copy.out(torch.randn(2, 3), [0, 1, 2], out=torch.empty(0))
    opcheck(PERMUTE_COPY.aten, (torch.randn(2, 3, 4), [1, 2, 0]))


class ChannelShuffle(torch.nn.Module):  # ShuffleNetV2's
    def forward(self, x):
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w).permute(0, 2, 3, 1)


def test_channel_shuffle_permutes_become_the_gather(fused_matches_eager):
    model, args = ChannelShuffle(), (torch.randn(2, 8, 3, 5),)
    out = etfuse.fuse(edge_program(model, args))
    # the copy export left after the first permute: dropped
    assert op_names(out.exported_program().graph_module) == ["aten.view_copy.default", "etfuse.permute_copy.default",
                                                             "aten.view_copy.default", "etfuse.permute_copy.default"]
    fused_matches_eager(model, args, out, rtol=0, atol=0)
