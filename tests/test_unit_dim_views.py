"""UnitDimViewsPass: static unsqueeze / squeeze copies (conv1d's, around its conv2d kernel) and
permutes that move only unit dims become `view_copy`, and `to_executorch` makes them views: exact
ops, the runtime's operator list, eager / runtime / retrace; symbolic shapes keep their copies."""

from __future__ import annotations

import torch
from executorch.exir import to_edge

import etfuse
from etfuse.passes import UnitDimViewsPass
from etfuse.runtime import run
from fusion_helpers import assert_fused_matches_eager, edge_program, op_names

TOL = dict(rtol=1e-4, atol=1e-5)


class Conv1dStack(torch.nn.Module):  # wav2letter's shape: conv1d + relu, twice
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(4, 8, 5, padding=2)
        self.c2 = torch.nn.Conv1d(8, 6, 3)

    def forward(self, x):
        return torch.tanh(torch.relu(self.c2(torch.relu(self.c1(x)))))  # the last squeeze is not the output


def _runtime_ops(fused) -> list[str]:
    program = fused.to_executorch().executorch_program
    plan = program.execution_plan[0]
    return [plan.operators[i.instr_args.op_index].name for c in plan.chains for i in c.instructions
            if hasattr(i.instr_args, "op_index")]


def test_conv1d_unsqueezes_and_squeezes_are_views_on_the_runtime():
    torch.manual_seed(0)
    model, args = Conv1dStack().eval(), (torch.randn(1, 4, 40),)
    fused = etfuse.fuse(edge_program(model, args))
    # the program input's and the weights' unsqueezes are views too (each only read by its copy)
    conv, view = "etfuse.conv2d_act.default", "aten.view_copy.default"
    assert op_names(fused.exported_program().graph_module) == [view, view, conv, view,
                                                               view, view, conv, view, "aten.tanh.default"]
    # view_copy that is not a program output runs as memory.view: no copy kernel is called
    assert _runtime_ops(fused) == ["etfuse::conv2d_act", "etfuse::conv2d_act", "aten::tanh"]
    assert_fused_matches_eager(model, args, fused, **TOL)


class CacheRead(torch.nn.Module):
    """A mutable buffer read through an unsqueeze before an index_put updates it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, x, pos):
        before = self.cache.unsqueeze(0) * 2  # the old values
        self.cache.index_put_([pos], x)
        return before + self.cache.sum()


def test_a_buffer_also_read_by_its_update_keeps_its_copy():
    """to_executorch may run the update in place, and a view of the buffer read after it would see
    the new values: a buffer that another op reads keeps its unsqueeze copy."""
    model, args = CacheRead(), (torch.ones(1, 3), torch.tensor([1]))
    fused = etfuse.fuse(edge_program(model, args))
    assert "aten.unsqueeze_copy.default" in op_names(fused.exported_program().graph_module)
    want = CacheRead()(*args)
    torch.testing.assert_close(run(fused.to_executorch(), args)[0], want, rtol=0, atol=0)


def test_unsqueeze_that_is_the_output_and_symbolic_shapes():
    class Both(torch.nn.Module):
        def forward(self, x):
            return (x - 1).unsqueeze(1) + 1, (x * 2).unsqueeze(0)

    args = (torch.randn(3, 5),)
    edge = to_edge(torch.export.export(Both(), args))
    out = edge.transform([UnitDimViewsPass()]).exported_program()
    views = [n for n in out.graph.nodes if "view_copy" in str(n.target)]
    assert [list(n.args[1]) for n in views] == [[3, 1, 5], [1, 3, 5]]
    assert not [n for n in op_names(out.graph_module) if "squeeze" in n]
    for got, want in zip(out.module()(*args), Both()(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # a symbolic size: the unsqueezes stay
    dyn = {"x": {0: torch.export.Dim("n", min=2, max=8)}}
    gm = to_edge(torch.export.export(Both(), args, dynamic_shapes=dyn)).exported_program().graph_module
    assert op_names(UnitDimViewsPass()(gm).graph_module).count("aten.unsqueeze_copy.default") == 2


class HeadTranspose(torch.nn.Module):
    """A decoding step's attention layout changes: [1, 1, H, D] -> [1, H, 1, D] and back (only the
    unit dims move: views), next to one that moves data ([1, 2, H, D] -> [1, H, 2, D])."""

    def forward(self, x, y):
        a = x.sin().transpose(1, 2)  # [1, 3, 1, 4]: a view
        b = a.cos().permute(0, 2, 1, 3)  # back to [1, 1, 3, 4]: a view
        c = y.exp().transpose(1, 2)  # [1, 3, 2, 4]: a real permute
        return torch.tanh(b), torch.tanh(c)


def test_permutes_that_move_only_unit_dims_are_views_on_the_runtime(fused_matches_eager):
    model, args = HeadTranspose(), (torch.randn(1, 1, 3, 4), torch.randn(1, 2, 3, 4))
    fused = etfuse.fuse(edge_program(model, args))
    sin, cos, exp, tanh, view = (f"aten.{op}.default" for op in ("sin", "cos", "exp", "tanh", "view_copy"))
    assert op_names(fused.exported_program().graph_module) == [
        sin, view, cos, view, exp, "etfuse.permute_copy.default", tanh, tanh]
    views = [n for n in fused.exported_program().graph.nodes if "view_copy" in str(n.target)]
    assert [list(n.args[1]) for n in views] == [[1, 3, 1, 4], [1, 1, 3, 4]]
    assert _runtime_ops(fused) == ["aten::sin", "aten::cos", "aten::exp", "etfuse::permute_copy", "aten::tanh",
                                   "aten::tanh"]
    fused_matches_eager(model, args, fused, **TOL)
    # aten's permute_copy, outside etfuse.fuse: the same rewrite
    out = to_edge(torch.export.export(model, args)).transform([UnitDimViewsPass()]).exported_program()
    assert op_names(out.graph_module).count("aten.permute_copy.default") == 1
    for got, want in zip(out.module()(*args), model(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class ChannelsLastUnsqueeze(torch.nn.Module):
    """Fuzz graph 8784 of seed 44: a channels-last RMS norm's output unsqueezed, then permuted."""

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.unsqueeze(1).permute(3, 0, 1, 2, 4) * 1.5


def test_a_source_in_another_memory_order_is_made_contiguous_before_its_view(fused_matches_eager):
    """The view shares its source's bytes and reads them in its own dim order: a channels-last
    source (dim order 0, 2, 3, 1) under a contiguous unsqueeze is copied to the contiguous order
    first (the portable unsqueeze_copy, a memcpy, read it as wrongly as a bare view did)."""
    model = ChannelsLastUnsqueeze()
    args = (torch.randn(2, 4, 4, 3).to(memory_format=torch.channels_last),)
    fused = etfuse.fuse(edge_program(model, args))
    assert op_names(fused.exported_program().graph_module) == [
        "etfuse.rms_norm.default", "dim_order_ops._clone_dim_order.default", "aten.view_copy.default",
        "etfuse.permute_copy.default", "aten.mul.Tensor"]
    fused_matches_eager(model, args, fused, **TOL)
