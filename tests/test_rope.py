"""Rotary embeddings: executorch's llama `apply_rotary_emb` -> `etfuse::rope`, checked against
its pattern (bit for bit), against executorch's own function, and on the runtime."""

from __future__ import annotations

import pytest
import torch

import etfuse
from etfuse.backend_ops import ROPE
from etfuse.runtime import run
from fusion_helpers import edge_program, example_llama, op_names


pytestmark = pytest.mark.usefixtures("eager_kernels")


def _angles(shape, g):
    theta = torch.rand(shape, generator=g) * 6.0
    return theta.cos(), theta.sin()


@pytest.mark.parametrize("x_shape,angle_shape,strided", [
    ((1, 9, 4, 16), (1, 9, 1, 8), False),  # llama prefill
    ((1, 1, 6, 48), (1, 1, 1, 24), False),  # llama decode
    ((2, 5, 3, 8), (2, 5, 3, 4), True),     # one angle per element, x read through strides
    ((2, 5, 3, 8), (5, 1, 4), False),       # fewer dims
    ((3, 6), (1, 3), False),                # rank 2, one angle per pair
], ids=str)
def test_kernel_is_its_pattern_bit_for_bit(x_shape, angle_shape, strided):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g)
    if strided:
        x = torch.randn(tuple(reversed(x_shape)), generator=g).permute(*reversed(range(len(x_shape))))
    cos, sin = _angles(angle_shape, g)
    want = ROPE.pattern(x, cos, sin)
    got = ROPE.aten_out(x, cos, sin, out=torch.empty(0))
    assert torch.equal(got, want)


def test_pattern_is_executorchs_apply_rotary_emb():
    from executorch.examples.models.llama.rope import apply_rotary_emb

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 9, 4, 16, generator=g), torch.randn(1, 9, 2, 16, generator=g)
    cos, sin = _angles((9, 8), g)
    want_q, want_k = apply_rotary_emb(q, k, cos, sin)
    c, s = cos.view(1, 9, 1, 8), sin.view(1, 9, 1, 8)  # executorch's reshape_for_broadcast
    assert torch.equal(ROPE.pattern(q, c, s), want_q) and torch.equal(ROPE.pattern(k, c, s), want_k)


def test_opcheck_and_named_errors():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 2, 8, generator=g)
    cos, sin = _angles((1, 3, 1, 4), g)
    torch.library.opcheck(ROPE.aten, (x, cos, sin))
    torch.library.opcheck(ROPE.aten_out, (x, cos, sin), {"out": torch.empty_like(x)},
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    with pytest.raises(RuntimeError, match=r"etfuse::rope.out: x \[1, 3, 2, 7\] must have an even last dimension"):
        ROPE.aten_out(torch.randn(1, 3, 2, 7), cos, sin, out=torch.empty(0))
    with pytest.raises(RuntimeError, match=r"etfuse::rope.out: sin \[1, 3, 1, 3\] does not broadcast to \[1, 3, 2, 4\]"):
        ROPE.aten_out(x, cos, torch.randn(1, 3, 1, 3), out=torch.empty(0))


def test_llama_q_and_k_rotations_are_one_op_each():
    model = example_llama(kv_cache=False)
    tokens = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    edge = edge_program(model, (tokens,))
    fused = etfuse.fuse(edge)
    ops = op_names(fused.exported_program().graph_module)
    assert ops.count("etfuse.rope.default") == 4  # 2 layers, q and k
    assert "aten.cat.default" not in ops and "aten.sub.Tensor" not in ops and "aten.squeeze_copy.dims" not in ops
    assert op_names(edge.exported_program().graph_module).count("aten.cat.default") == 4
    retraced = [str(n.target) for n in fused.exported_program().run_decompositions().graph.nodes]
    assert not [t for t in retraced if "etfuse" in t]
    torch.testing.assert_close(run(fused.to_executorch(), (tokens,))[0], model(tokens), rtol=1e-4, atol=1e-5)
