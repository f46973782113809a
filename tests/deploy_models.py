"""Fused programs for the C++ deployment checks: each case is a `.pte` (etfuse ops in it), its
inputs and eager PyTorch's outputs, small enough to run in well under a second under qemu.

`write_case` lays a case out as the C++ runner reads it (`model.pte`, `input_<i>.bin`, raw
bytes); `read_outputs` reads the runner's `output_<i>.bin` back as tensors shaped like
`expected`."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.exir import to_edge

import etfuse
from fusion_helpers import edge_program, eval_with_bn_stats, example_llama, pt2e_int8

# float32 kernels sum in another order than eager's: rounding differences only
FLOAT_TOL = dict(atol=1e-5, rtol=1e-4)


@dataclass(frozen=True)
class DeployCase:
    name: str
    pte_bytes: bytes
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]
    atol: float
    rtol: float
    etfuse_ops: frozenset[str]  # every etfuse op in the execution plan (`plan_operators`' names)
    operators: tuple[str, ...] = ()  # the whole plan's operator table: the kernels a runner must register


def plan_operators(program) -> list[str]:
    """The operator table of the program's execution plan (control-flow bodies included), as the
    runtime's kernel registry names them: `name.overload`, or `name` for the default overload
    (`etfuse::update_cache_`)."""
    return [f"{o.name}.{o.overload}" if o.overload else o.name
            for o in program.executorch_program.execution_plan[0].operators]


def _case(name, fused, inputs, expected, atol, rtol) -> DeployCase:
    program = fused.to_executorch()
    operators = plan_operators(program)
    ops = frozenset(o for o in operators if o.startswith("etfuse::"))
    assert ops, f"{name}: nothing fused, the program has no etfuse op"
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    return DeployCase(name, bytes(program.buffer), [t.clone() for t in inputs], [t.detach().clone() for t in expected],
                      atol, rtol, ops, tuple(operators))


def _float_case(name, model, inputs) -> DeployCase:
    with torch.no_grad():
        expected = model(*inputs)
    return _case(name, etfuse.fuse(edge_program(model, tuple(inputs))), inputs, expected, **FLOAT_TOL)


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         act())


# ---- a. a plain CNN ------------------------------------------------------------------------------

class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 16), _conv_bn(16, 32), nn.MaxPool2d(2), _conv_bn(32, 32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


@functools.lru_cache(maxsize=None)
def cnn() -> DeployCase:
    torch.manual_seed(0)
    return _float_case("cnn", eval_with_bn_stats(Cnn()), [torch.randn(1, 3, 32, 32)])


# ---- b. MobileNet-style depthwise separable blocks -----------------------------------------------

class DepthwiseSeparable(nn.Module):
    def __init__(self):
        super().__init__()
        blocks = [_conv_bn(3, 16, stride=2, act=nn.ReLU6)]
        for cin, cout, stride in ((16, 24, 1), (24, 32, 2), (32, 32, 1)):
            blocks += [_conv_bn(cin, cin, 3, stride, groups=cin, act=nn.ReLU6), _conv_bn(cin, cout, 1, act=nn.ReLU6)]
        self.features = nn.Sequential(*blocks)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


@functools.lru_cache(maxsize=None)
def depthwise_separable() -> DeployCase:
    torch.manual_seed(1)
    return _float_case("depthwise_separable", eval_with_bn_stats(DepthwiseSeparable()), [torch.randn(1, 3, 32, 32)])


# ---- c. a pre-norm transformer block -------------------------------------------------------------

class TransformerBlock(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


@functools.lru_cache(maxsize=None)
def transformer_block() -> DeployCase:
    torch.manual_seed(2)
    return _float_case("transformer_block", TransformerBlock().eval(), [torch.randn(1, 16, 64)])


# ---- d. an int8 CNN from PT2E (XNNPACK quantizer, per-channel weights) ---------------------------

class Int8Cnn(nn.Module):
    """conv+bn+relu stem, a depthwise + pointwise pair added back to its input (the quantized
    residual add), global pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(3, 16)
        self.dw = _conv_bn(16, 16, groups=16)
        self.pw = nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.pw(self.dw(y))
        return self.fc(F.max_pool2d(y, 2).mean((2, 3)))


@functools.lru_cache(maxsize=None)
def int8_pt2e_cnn() -> DeployCase:
    torch.manual_seed(3)
    inputs = [torch.randn(1, 3, 32, 32)]
    ep = pt2e_int8(eval_with_bn_stats(Int8Cnn()), tuple(inputs))
    expected = ep.module()(*inputs)
    # the contract: the PT2E model's eager output, bit for bit
    return _case("int8_pt2e_cnn", etfuse.fuse(to_edge(ep)), inputs, expected, atol=0, rtol=0)


# ---- e. one decode step of an int4 weight-only llama with a KV cache -----------------------------

@functools.lru_cache(maxsize=None)
def int4_llama_decode() -> DeployCase:
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_

    model = example_llama(kv_cache=True, multiple_of=32)  # hidden dim a multiple of the group
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    eager = copy.deepcopy(model)  # its caches start zero as the program's do
    token, pos = torch.tensor([[5]]), torch.tensor([0])
    with torch.no_grad():
        expected = eager(token, {"input_pos": pos})
    fused = etfuse.fuse(edge_program(model, (token, {"input_pos": pos})))
    return _case("int4_llama_decode", fused, [token, pos], expected, **FLOAT_TOL)


# ---- f. torch.cond between two fusable branches --------------------------------------------------

class Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, y):
        return torch.cond(x.sum() > 0, lambda x, y: torch.relu(x + y), lambda x, y: torch.relu(self.fc(x)), (x, y))


@functools.lru_cache(maxsize=None)
def _cond_program():
    torch.manual_seed(4)
    model = Cond().eval()
    return model, etfuse.fuse(edge_program(model, (torch.ones(4, 16), torch.randn(4, 16))))


def _cond_case(name, x, y) -> DeployCase:
    model, fused = _cond_program()
    with torch.no_grad():
        expected = model(x, y)
    return _case(name, fused, [x, y], expected, **FLOAT_TOL)


@functools.lru_cache(maxsize=None)
def cond_then() -> DeployCase:
    """x sums above 0: relu(x + y)."""
    g = torch.Generator().manual_seed(5)
    return _cond_case("cond_then", torch.randn(4, 16, generator=g).abs(), torch.randn(4, 16, generator=g))


@functools.lru_cache(maxsize=None)
def cond_else() -> DeployCase:
    """x sums below 0: relu(fc(x))."""
    g = torch.Generator().manual_seed(6)
    return _cond_case("cond_else", -torch.randn(4, 16, generator=g).abs(), torch.randn(4, 16, generator=g))


# ---- g. quantized embeddings at 2, 4 and 8 bits (torchao), the stock kernels' names' twins -------

@functools.lru_cache(maxsize=None)
def quantized_embeddings() -> DeployCase:
    from test_embeddings import torchao_model

    m = torchao_model(torch.float32)
    inputs = [torch.tensor([[3, 0, 19], [7, 7, 1]])]
    with torch.no_grad():
        expected = m(*inputs)
    fused = etfuse.fuse(to_edge(torch.export.export(m, tuple(inputs))))
    return _case("quantized_embeddings", fused, inputs, expected, atol=0, rtol=0)  # bit for bit (test_embeddings)


CASES = {f.__name__: f for f in (cnn, depthwise_separable, transformer_block, int8_pt2e_cnn, int4_llama_decode,
                                 cond_then, cond_else, quantized_embeddings)}


def all_cases() -> list[DeployCase]:
    return [f() for f in CASES.values()]


# ---- files for the C++ runner --------------------------------------------------------------------

def write_case(case: DeployCase, folder) -> Path:
    """`model.pte` and `input_<i>.bin` (each tensor's raw bytes, contiguous) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pte").write_bytes(case.pte_bytes)
    for i, t in enumerate(case.inputs):
        (folder / f"input_{i}.bin").write_bytes(t.contiguous().numpy().tobytes())
    return folder


def read_outputs(folder, expected: list[torch.Tensor]) -> list[torch.Tensor]:
    """`output_<i>.bin` in `folder`, one per expected tensor, with its dtype and shape; a file
    of the wrong size fails here, naming it."""
    folder = Path(folder)
    outs = []
    for i, want in enumerate(expected):
        path = folder / f"output_{i}.bin"
        data = path.read_bytes()
        size = want.numel() * want.element_size()
        assert len(data) == size, f"{path}: {len(data)} bytes, expected {size} ({want.dtype}, {list(want.shape)})"
        outs.append(torch.frombuffer(bytearray(data), dtype=want.dtype).reshape(want.shape) if size else
                    torch.empty(want.shape, dtype=want.dtype))
    return outs
