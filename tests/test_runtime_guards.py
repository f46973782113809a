"""etfuse.runtime checks inputs against the .pte before the ExecuTorch runtime reads them.

The stock runtime accepts a channels-last tensor for a program exported with contiguous inputs
(and the reverse) and reads its bytes in the wrong order: wrong values, no error. It answers a
wrong dtype or shape with a bare error code. etfuse's `run` / `load_method(...).execute` copy
other layouts into the program's and name the input and what it expects otherwise."""

import pytest
import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime

import etfuse
from etfuse.runtime import InputMismatchError, input_specs, load_method, run


class ConvRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


X = torch.randn(1, 3, 4, 5)
CHANNELS_LAST = X.contiguous(memory_format=torch.channels_last)
TRANSPOSED = X.transpose(2, 3).contiguous().transpose(2, 3)  # neither layout


def _programs(model, example):
    """(stock .pte, etfuse-fused .pte) of `model` exported with `example`."""
    ep = torch.export.export(model, example)
    stock = to_edge(ep).to_executorch().buffer
    fused = etfuse.fuse(to_edge(torch.export.export(model, example))).to_executorch().buffer
    return stock, fused


@pytest.mark.parametrize("which", ["stock", "fused"])
@pytest.mark.parametrize("exported_as, given", [
    ("contiguous", CHANNELS_LAST), ("contiguous", TRANSPOSED), ("channels_last", X),
])
def test_inputs_in_another_layout_are_converted_not_misread(which, exported_as, given):
    model = ConvRelu().eval()
    example = (X if exported_as == "contiguous" else CHANNELS_LAST,)
    stock, fused = _programs(model, example)
    pte = stock if which == "stock" else fused
    expected = model(X)
    if given.is_contiguous() or given.is_contiguous(memory_format=torch.channels_last):
        # The upstream bug: executorch's own runtime reads the other layout's bytes as its own.
        raw = Runtime.get().load_program(pte).load_method("forward").execute((given,))[0]
        assert not torch.allclose(raw, expected, atol=1e-4)
    (out,) = run(pte, (given,))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_input_specs_read_from_the_pte():
    stock, _ = _programs(ConvRelu().eval(), (CHANNELS_LAST,))
    (spec,) = input_specs(stock)
    assert (spec.kind, spec.dtype, spec.sizes, spec.dim_order, spec.dynamic) == (
        "tensor", torch.float32, (1, 3, 4, 5), (0, 2, 3, 1), False)


@pytest.fixture(scope="module")
def add_relu_method():
    args = (torch.randn(4, 8), torch.randn(4, 8))
    _, fused = _programs(AddRelu(), args)
    return load_method(fused)


@pytest.mark.parametrize("inputs, message", [
    ((torch.randn(4, 8).double(), torch.randn(4, 8)),
     r"^input 0: expected dtype float32, got float64 \(the program takes a float32 tensor of rank 2, sizes \[4, 8\]\)$"),
    ((torch.randn(4, 8), torch.randn(4, 8).long()), r"^input 1: expected dtype float32, got int64"),
    ((torch.randn(4, 8), torch.randn(8)), r"^input 1: expected rank 2, got shape \[8\]"),
    ((torch.randn(4, 9), torch.randn(4, 8)), r"^input 0: dim 1 is 9, the program expects 8"),
    ((torch.randn(4, 8),), r"^forward takes 2 inputs, got 1$"),
    ((torch.randn(4, 8), 3.0), r"^input 1: expected a float32 tensor .*, got a float$"),
])
def test_wrong_inputs_name_the_input(add_relu_method, inputs, message):
    with pytest.raises(InputMismatchError, match=message):
        add_relu_method.execute(inputs)
    args = (torch.randn(4, 8), torch.randn(4, 8))
    torch.testing.assert_close(add_relu_method.execute(args)[0], torch.relu(args[0] + args[1]))  # still usable


def test_dynamic_dims_are_checked_against_their_bound():
    model = ConvRelu().eval()
    h = torch.export.Dim("h", min=2, max=8)
    ep = torch.export.export(model, (X,), dynamic_shapes=({2: h},))
    method = load_method(to_edge(ep).to_executorch())
    (spec,) = method.input_specs
    assert spec.dynamic and spec.sizes == (1, 3, 8, 5)
    x = torch.randn(1, 3, 6, 5)
    torch.testing.assert_close(method.execute((x,))[0], model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputMismatchError, match=r"^input 0: dim 2 is 9, the program expects at most 8"):
        method.execute((torch.randn(1, 3, 9, 5),))
