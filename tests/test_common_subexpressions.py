"""CommonSubexpressionPass: what export traced once per layer runs once; what could differ stays."""

import torch
import torch.fx as fx
from executorch.exir import ExecutorchBackendConfig

import etfuse
from etfuse.passes import CommonSubexpressionPass, default_passes
from fusion_helpers import assert_fused_matches_eager, edge_program, op_names


class MaskedLayer(torch.nn.Module):
    """Like a llama layer: its own copy of one causal mask, read at the positions given."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)))
        self.proj = torch.nn.Linear(n, n)

    def forward(self, x, pos):
        bias = torch.where(self.mask[pos], 0.0, float("-inf"))
        return torch.softmax(self.proj(x) + bias, -1)


class TwoLayers(torch.nn.Module):
    def __init__(self, n: int = 8):
        super().__init__()
        self.a, self.b = MaskedLayer(n), MaskedLayer(n)

    def forward(self, x, pos):
        return self.b(self.a(x, pos), pos)


def _count(gm: fx.GraphModule, name: str) -> int:
    return op_names(gm).count(name)


def test_layers_with_equal_buffers_build_their_mask_once():
    model, args = TwoLayers().eval(), (torch.randn(3, 8), torch.tensor([1, 4, 7]))
    edge = edge_program(model, args)
    before = edge.exported_program().graph_module
    assert (_count(before, "aten.index.Tensor"), _count(before, "aten.where.self")) == (2, 2)
    fused = etfuse.fuse(edge)
    ep = fused.exported_program()
    assert (_count(ep.graph_module, "aten.index.Tensor"), _count(ep.graph_module, "aten.where.self")) == (1, 1)
    # one mask is stored; the two layers' different weights stay two
    targets = [s.target for s in ep.graph_signature.input_specs if s.target]
    assert [t for t in targets if "mask" in t] == ["a.mask"]
    linears = [n for n in ep.graph.nodes if n.op == "call_function" and "linear" in str(n.target)]
    assert len(linears) == 2 and linears[0].args[1] is not linears[1].args[1]
    assert_fused_matches_eager(model, args, fused)
    # the graph-module route has no values: the masks stay two, the ops on each stay apart
    program = edge_program(model, args).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    assert [n for n in op_names(program.exported_program().graph_module) if "where" in n] == ["aten.where.self_out"] * 2


def _graph(build) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_reads_around_an_in_place_write_stay_apart():
    aten = torch.ops.aten

    def build(g, x):
        before = g.call_function(aten.mul.Tensor, (x, 2.0))
        g.call_function(aten.add_.Scalar, (x, 1.0))
        after = g.call_function(aten.mul.Tensor, (x, 2.0))
        return g.call_function(aten.sub.Tensor, (after, before))

    result = CommonSubexpressionPass()(_graph(build))
    assert not result.modified
    assert torch.equal(result.graph_module(torch.zeros(3)), torch.full((3,), 2.0))


def test_random_ops_and_different_constants_stay_apart():
    aten = torch.ops.aten

    def build(g, x):
        r1, r2 = (g.call_function(aten.rand_like.default, (x,)) for _ in range(2))
        a, b = g.call_function(aten.mul.Tensor, (x, 2)), g.call_function(aten.mul.Tensor, (x, 2.0))
        return (g.call_function(aten.sub.Tensor, (r1, r2)), a, b)

    result = CommonSubexpressionPass()(_graph(build))
    assert not result.modified  # 2 and 2.0 are different arguments (int vs float promotion)
    assert _count(result.graph_module, "aten.rand_like.default") == 2


def test_repeated_pure_ops_merge_and_outputs_stay_their_own():
    aten = torch.ops.aten

    def build(g, x):
        a, b = g.call_function(aten.mul.Tensor, (x, 3.0)), g.call_function(aten.mul.Tensor, (x, 3.0))
        c = g.call_function(aten.add.Tensor, (a, b))
        d = g.call_function(aten.add.Tensor, (a, b))
        return (g.call_function(aten.mul.Tensor, (c, d)), d)  # d is an output: it stays

    result = CommonSubexpressionPass()(_graph(build))
    assert result.modified
    assert op_names(result.graph_module) == ["aten.mul.Tensor", "aten.add.Tensor", "aten.add.Tensor",
                                             "aten.mul.Tensor"]
    x = torch.randn(4)
    got = result.graph_module(x)
    torch.testing.assert_close(got[0], (6 * x) * (6 * x))
    torch.testing.assert_close(got[1], 6 * x)


def test_a_parameter_and_a_buffer_of_equal_values_stay_apart():
    """A fresh batch norm's bias (a parameter, zeros) and running mean (a buffer, zeros): merged,
    the mean would become a tensor that requires grad, which the batch norm refuses."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    args = (torch.randn(1, 3, 8, 8),)
    fused = etfuse.fuse(edge_program(model, args))
    bn = next(n for n in fused.exported_program().graph.nodes if n.op == "call_function")
    assert bn.args[4] is not bn.args[5]  # bn_bias, running_mean
    assert_fused_matches_eager(model, args, fused)


def test_quantized_residual_keeps_a_dequantize_per_consumer_and_lowers_to_xnnpack():
    """PT2E gives each consumer of a quantized tensor its own dequantize; merged into one, the
    XNNPACK partitioner joined two partitions through it and failed with "Invalid partition,
    found dependency cycles" (int8 MobileNetV2 on the passes_beside_xnnpack route)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from etfuse.passes import passes_beside_xnnpack
    from fusion_helpers import pt2e_int8

    class Blocks(torch.nn.Module):
        """Two MobileNetV2 inverted residuals: each block's input feeds its expand conv and its add."""

        def __init__(self):
            super().__init__()

            def block():
                return torch.nn.Sequential(
                    torch.nn.Conv2d(8, 32, 1), torch.nn.ReLU6(), torch.nn.Conv2d(32, 32, 3, padding=1, groups=32),
                    torch.nn.ReLU6(), torch.nn.Conv2d(32, 8, 1))

            self.stem, self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), block(), block()

        def forward(self, x):
            x = self.stem(x)
            x = x + self.a(x)
            return x + self.b(x)

    def dequantizes(gm):
        return sum("dequantize_per_tensor" in name for name in op_names(gm))

    x = torch.randn(1, 3, 12, 12)
    ep = pt2e_int8(Blocks().eval(), (x,))
    gm = etfuse.to_edge(ep).exported_program().graph_module
    before = dequantizes(gm)
    assert before > 6  # a dequantize per consumer: the blocks' inputs have two each
    assert dequantizes(CommonSubexpressionPass()(gm).graph_module) == before
    lowered = to_edge_transform_and_lower(ep, transform_passes=passes_beside_xnnpack(),
                                          partitioner=[XnnpackPartitioner()])
    assert any("executorch_call_delegate" in name for name in op_names(lowered.exported_program().graph_module))
