"""etfuse::sdpa (backend_ops/attention_ops.py, kernels/csrc/ops/sdpa.cpp, patterns/attention_rules.py):
the kernel against torch's scaled_dot_product_attention, the rules on the edge dialect's
decomposition (exact ops, eager / runtime / retrace equal to eager), and executorch's example
llama end to end (prefill logits, greedy decoding with a KV cache on the runtime)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import etfuse
import etfuse.backend_ops  # noqa: F401  (schemas before the kernels load)
from etfuse.backend_ops import SDPA
from etfuse.runtime import load_method, run
from fusion_helpers import assert_greedy_decoding_matches_eager, benchmark_module, edge_program, example_llama, op_names

TOL = dict(rtol=1e-4, atol=1e-5)
INF = float("inf")

pytestmark = pytest.mark.usefixtures("eager_kernels")


def sdpa_out(q, k, v, mask=None, scale=1.0):
    out = torch.empty(0)
    return torch.ops.etfuse.sdpa.out(q, k, v, mask, scale, out=out)


# B, H, L, S, D, Dv, mask shape (None: no mask): the dot path (L < 8) and the GEMM path, odd sizes
KERNEL_CASES = [
    (1, 6, 1, 37, 48, 48, None),
    (2, 3, 5, 7, 8, 11, (5, 7)),
    (1, 4, 3, 130, 16, 16, (1, 1, 3, 130)),
    (2, 2, 40, 33, 20, 9, (2, 1, 40, 33)),
    (1, 3, 64, 64, 32, 32, (64, 64)),
    (1, 2, 9, 1, 4, 4, (1, 9, 1)),
    # grouped-query heads: k and v with H / 4 and H / 2 heads
    (1, 8, 2, 19, 16, 16, None, 2),
    (2, 4, 12, 10, 8, 8, (12, 10), 2),
]


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
@pytest.mark.parametrize("case", KERNEL_CASES, ids=str)
def test_kernel_matches_torch(case, kernel_isa):
    B, H, L, S, D, Dv, mask_shape = case[:7]
    Hk = H // (case[7] if len(case) > 7 else 1)
    g = torch.Generator().manual_seed(sum(case[:6]))
    q = torch.randn(B, H, L, D, generator=g)
    k, v = (torch.randn(B, Hk, S, d, generator=g) for d in (D, Dv))
    mask = None if mask_shape is None else torch.randn(mask_shape, generator=g)
    got = sdpa_out(q, k, v, mask, 0.3)
    # read in place through strides: q and v as transposed views of [B, L, H, D] storage
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    vt = v.transpose(1, 2).contiguous().transpose(1, 2)
    got_strided = sdpa_out(qt, k, vt, mask, 0.3)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=Hk != H)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_strided, want, **TOL)


@pytest.mark.parametrize("L", [3, 20])  # dot path, GEMM path
def test_all_masked_rows_are_zero_like_the_decomposition(L):
    q, k, v = torch.randn(1, 2, L, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.zeros(L, 6)
    mask[1] = -INF  # every key masked for query 1
    mask[2, :3] = -INF
    got = sdpa_out(q, k, v, mask, 0.5)
    assert torch.equal(got[:, :, 1], torch.zeros(1, 2, 8))
    # the edge dialect's own decomposition (what the rule replaces) gives 0 there too
    edge = edge_program(Attention(masked=True, scale=0.5), (q, k, v, mask))
    torch.testing.assert_close(got, edge.exported_program().module()(q, k, v, mask), **TOL)


@pytest.mark.parametrize("kernel_isa", ["auto", "baseline"], indirect=True)
def test_decoding_skips_the_keys_its_mask_hides(kernel_isa):
    """A decoding step's causal mask hides the cache slots past its position: the dot path skips
    them, so what they hold (here NaN: never written) does not reach the output, as with
    executorch's own sdpa_with_kv_cache, which reads only up to the position."""
    q, k, v = torch.randn(1, 6, 2, 48), torch.randn(1, 6, 130, 48), torch.randn(1, 6, 130, 48)
    mask = torch.full((2, 130), -INF)
    mask[0, :7], mask[1, :8] = 0.0, 0.0
    k[:, :, 8:], v[:, :, 8:] = float("nan"), float("nan")
    got = sdpa_out(q, k, v, mask, 0.2)
    want = F.scaled_dot_product_attention(q, k[:, :, :8], v[:, :, :8], attn_mask=mask[:, :8], scale=0.2)
    torch.testing.assert_close(got, want, **TOL)


def test_bad_shapes_are_named():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match=r"etfuse::sdpa.out: query \[1, 2, 3, 8\], key \[1, 2, 5, 4\]"):
        sdpa_out(q, torch.randn(1, 2, 5, 4), k)
    with pytest.raises(RuntimeError, match=r"mask of shape \[4, 5\] does not broadcast to the scores \[1, 2, 3, 5\]"):
        sdpa_out(q, k, k, torch.randn(4, 5))
    with pytest.raises(RuntimeError, match=r"Hk dividing H"):
        sdpa_out(torch.randn(1, 3, 3, 8), k, k)
    with pytest.raises(RuntimeError, match=r"query must be 4-D"):
        sdpa_out(torch.randn(2, 3, 8), k, k)


def test_opcheck_and_the_pattern_is_torchs_attention(kernel_check, opcheck):
    """The pattern (what a retrace gives back) is torch's SDPA; the kernel, in eager and on the
    runtime, the pattern (with q, k, v transposed views, channels-last, ...: test_out_kernels.py)."""
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 4)
    cases = ((q, k, v), (q, k, v, torch.randn(3, 5), 0.25))
    for args in cases:
        opcheck(SDPA.aten, args)
        torch.testing.assert_close(SDPA.pattern(*args), F.scaled_dot_product_attention(
            q, k, v, attn_mask=args[3] if len(args) > 3 else None, scale=args[4] if len(args) > 4 else 1.0))
        kernel_check.eager(SDPA, args, tol=TOL)
    kernel_check.runtime(SDPA, [(*cases[0], None, 1.0), cases[1]], tol=TOL)


# --------------------------------------------------------------------------------------------
# fusion


class Attention(torch.nn.Module):
    def __init__(self, masked=False, **kw):
        super().__init__()
        self.masked, self.kw = masked, kw

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kw)


class GroupedAttention(torch.nn.Module):
    """llama's way: k and v heads repeated with repeat_interleave before SDPA."""

    def forward(self, q, k, v, mask):
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1),
                                              attn_mask=mask)


class SelfAttention(torch.nn.Module):
    """Projections, heads, SDPA with a boolean causal mask buffer, output projection."""

    def __init__(self, dim=32, heads=4, seq=6):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal[:t, :t])
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def _fused(model, args):
    edge = edge_program(model, args)
    out = etfuse.fuse(edge)
    return edge, out


def _sdpa_forms():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 6)
    forms = {
        "no mask": (Attention(), (q, k, v), ["etfuse.sdpa.default"]),
        "scale": (Attention(scale=0.2), (q, k, v), ["etfuse.sdpa.default"]),
        "float mask": (Attention(masked=True), (q, k, v, torch.randn(5, 7)), ["etfuse.sdpa.default"]),
        # a boolean mask becomes where(mask, 0, -inf): a stock op feeding the fused one
        "bool mask": (Attention(masked=True), (q, k, v, torch.rand(2, 1, 5, 7) > 0.3),
                      ["aten.scalar_tensor.default", "aten.scalar_tensor.default", "aten.where.self",
                       "etfuse.sdpa.default"]),
    }
    forms["grouped, 3 per head"] = (GroupedAttention(), (torch.randn(1, 6, 4, 8), torch.randn(1, 2, 5, 8),
                                                         torch.randn(1, 2, 5, 8), torch.randn(4, 5)),
                                    ["etfuse.sdpa.default"])
    forms["grouped, 1 per head"] = (GroupedAttention(), (q, k, v, torch.randn(5, 7)), ["etfuse.sdpa.default"])
    return forms


@pytest.mark.parametrize("form", list(_sdpa_forms()))
def test_each_sdpa_form_is_one_op(fused_matches_eager, form):
    model, args, ops = _sdpa_forms()[form]
    edge, out = _fused(model, args)
    assert op_names(out.exported_program().graph_module) == ops
    fused_matches_eager(model, args, out, **TOL)


def test_causal_self_attention_block(fused_matches_eager):
    model, args = SelfAttention().eval(), (torch.randn(2, 6, 32),)
    edge, out = _fused(model, args)
    ops = op_names(out.exported_program().graph_module)
    assert ops.count("etfuse.sdpa.default") == 1
    for gone in ("aten._softmax.default", "aten.any.dim", "aten.mul.Scalar"):
        assert gone not in ops
    # the one bmm left is the output projection: a linear on [B, T, C] lowers to
    # expand/view/bmm, which no rule fuses yet
    assert ops.count("aten.bmm.default") == 1
    fused_matches_eager(model, args, out, **TOL)


@pytest.mark.parametrize("batch", [1, 2])
def test_vit_attention_q_k_v_unbound_from_one_qkv_linear(fused_matches_eager, batch):
    # q, k, v are slices of one permuted tensor (slice_copy + squeeze_copy each, the squeezes
    # view_copys for to_executorch to make views: UnitDimViewsPass), read by sdpa through their
    # strides; the decomposition's closing permutes go into the op (sdpa_closed)
    # (7 and 14 rows: the linears read their weights packed at fuse time, PrepackWeightsPass)
    head = ["etfuse.linear_packed_act.default", "aten.view_copy.default", "etfuse.permute_copy.default",
            *["aten.slice_copy.Tensor"] * 3, *["aten.view_copy.default"] * 3, "etfuse.sdpa.default"]
    tail = ["etfuse.permute_copy.default", "aten.view_copy.default", "etfuse.linear_packed_act.default"]
    model, args = benchmark_module("transformers").VitAttention(32, 4).eval(), (torch.randn(batch, 7, 32),)
    passes = etfuse.passes.default_passes()
    out = etfuse.fuse(edge_program(model, args), passes)
    ops = op_names(out.exported_program().graph_module)
    if batch == 1:
        assert ops == head + tail
    else:  # the proj linear on the transposed [2, 7, 32] lowers to expand/view/bmm: no rule yet
        assert ops[:len(head)] == head
        assert "aten._softmax.default" not in ops
    fusion = next(p for p in passes if type(p) is etfuse.passes.FusionPass)
    assert "sdpa_closed" in [f.rule for f in fusion.report.fused]
    fused_matches_eager(model, args, out, **TOL)


def test_scale_is_the_square_of_the_factor_export_applies():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    out = _fused(Attention(scale=0.37), (q, k, v))[1]
    node = next(n for n in out.exported_program().graph.nodes if "sdpa" in str(n.target))
    assert round(node.args[4] - 0.37, 6) == 0


def test_look_alikes_are_declined():
    class HandWritten(torch.nn.Module):  # softmax over the query axis: not attention
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

    args = (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
    assert "etfuse.sdpa.default" not in op_names(_fused(HandWritten(), args)[1].exported_program().graph_module)


# --------------------------------------------------------------------------------------------
# executorch's example llama


def _llama(kv_cache: bool):
    return example_llama(kv_cache)


def test_llama_prefill_logits_on_the_runtime():
    model = _llama(kv_cache=False)
    tokens = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    edge, out = _fused(model, (tokens,))
    ops = op_names(out.exported_program().graph_module)
    assert ops.count("etfuse.sdpa.default") == 2 and "aten.bmm.default" not in ops
    want = model(tokens)
    got = run(out.to_executorch(), (tokens,))[0]
    torch.testing.assert_close(got, want, **TOL)


def test_llama_greedy_decoding_with_a_kv_cache_matches_eager():
    model = _llama(kv_cache=True)
    eager = _llama(kv_cache=True)
    example = (torch.tensor([[1]]), {"input_pos": torch.tensor([0])})
    out = etfuse.fuse(edge_program(model, example))
    ops = op_names(out.exported_program().graph_module)
    assert ops.count("etfuse.sdpa.default") == 2
    # each layer's copy of the causal mask is one constant, its where(mask[pos], 0, -inf) one op
    assert (ops.count("aten.index.Tensor"), ops.count("aten.where.self"), ops.count("aten.scalar_tensor.default")) \
        == (3, 1, 2)
    method = load_method(out.to_executorch())
    assert_greedy_decoding_matches_eager(method, eager, 32, **TOL)  # the issue asks for 32 tokens


def test_llama_through_transform_and_beside_xnnpack():
    """The `transform` route gives `fuse`'s program; `passes_beside_xnnpack()` as the transform passes
    of `to_edge_transform_and_lower` fuses attention, RMS norm and rope before XNNPACK partitions the rest
    (after lowering, XNNPACK would have taken attention's bmm and softmax apart)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from etfuse.passes import default_passes, passes_beside_xnnpack

    model = _llama(kv_cache=False)
    tokens = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    want = model(tokens)
    edge, fused = _fused(model, (tokens,))
    transformed = edge.transform(default_passes())
    assert op_names(transformed.exported_program().graph_module) == op_names(fused.exported_program().graph_module)
    beside = etfuse.fuse(to_edge_transform_and_lower(torch.export.export(model, (tokens,)),
                                                     transform_passes=passes_beside_xnnpack(),
                                                     partitioner=[XnnpackPartitioner()]))
    ops = op_names(beside.exported_program().graph_module)
    assert ops.count("etfuse.sdpa.default") == 2 and ops.count("etfuse.rms_norm.default") == 5
    # rotary embeddings too: XNNPACK would leave their squeezes to the portable runtime
    assert ops.count("etfuse.rope.default") == 4 and "aten.squeeze_copy.dims" not in ops
    assert "executorch_call_delegate" in ops and not {"aten.bmm.default", "aten._softmax.default"} & set(ops)
    for program in (transformed.to_executorch(), beside.to_executorch()):
        torch.testing.assert_close(run(program, (tokens,))[0], want, **TOL)
