"""DropIdentityCopiesPass: eval-mode dropout's copy goes; copies someone could tell apart stay."""

import torch
import torch.nn.functional as F
from executorch.exir import ExecutorchBackendConfig

import etfuse
from etfuse.passes import DropIdentityCopiesPass, default_passes
from fusion_helpers import assert_fused_matches_eager, edge_program, op_names

CLONE = "dim_order_ops._clone_dim_order.default"


class ConvDropout(torch.nn.Module):
    """DS-CNN's tail: conv, dropout (a copy in eval mode), average pool."""

    def __init__(self):
        super().__init__()
        self.conv, self.drop = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.Dropout(0.4)

    def forward(self, x):
        return F.avg_pool2d(self.drop(F.relu(self.conv(x))), 2)


def test_dropout_copy_is_dropped_on_every_route():
    model, args = ConvDropout().eval(), (torch.randn(1, 4, 6, 6),)
    assert CLONE in op_names(edge_program(model, args).exported_program().graph_module)
    fused = etfuse.fuse(edge_program(model, args))
    assert op_names(fused.exported_program().graph_module) == ["etfuse.conv2d_act.default", "etfuse.avg_pool2d.default"]
    assert_fused_matches_eager(model, args, fused)
    transformed = edge_program(model, args).transform(default_passes())
    assert CLONE not in op_names(transformed.exported_program().graph_module)
    # the graph-module route: what the runtime runs has no copy
    program = edge_program(model, args).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    assert CLONE not in op_names(program.exported_program().graph_module)


class Copies(torch.nn.Module):
    def forward(self, x):
        y = x.clone()  # of a program input: the caller owns x
        z = (x + 1).clone()  # a program output
        return y * 2, z


def test_copies_of_inputs_and_copies_returned_stay():
    model, args = Copies(), (torch.randn(3, 4),)
    gm = edge_program(model, args).exported_program().graph_module
    result = DropIdentityCopiesPass()(gm)
    assert not result.modified
    assert op_names(result.graph_module).count(CLONE) == 2


class MutatesBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x):
        y = (x * 2).clone()
        self.seen.add_(y)
        return y + self.seen


def test_buffer_mutation_still_right_on_the_runtime():
    """Edge programs update a mutable buffer functionally (the new value is an output): the copy
    may go, and the buffer still accumulates call after call."""
    from etfuse.runtime import load_method

    args = (torch.randn(3),)
    method = load_method(etfuse.fuse(edge_program(MutatesBuffer(), args)).to_executorch())
    eager = MutatesBuffer()
    for _ in range(3):
        torch.testing.assert_close(method.execute(list(args))[0], eager(*args))


def test_graph_with_an_in_place_op_keeps_its_copies():
    """y is changed in place after it is copied: the copy holds the old values and must stay."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    copy = g.call_function(torch.ops.dim_order_ops._clone_dim_order.default, (y,))
    g.call_function(torch.ops.aten.add_.Tensor, (y, 1))
    g.output(g.call_function(torch.ops.aten.sub.Tensor, (copy, y)))
    for n in (x, y, copy):
        n.meta["val"] = torch.empty(3)
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    result = DropIdentityCopiesPass()(gm)
    assert not result.modified
    torch.testing.assert_close(result.graph_module(torch.ones(3)), torch.full((3,), -1.0))
