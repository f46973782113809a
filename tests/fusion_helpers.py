"""Helpers shared by the tests: lower a model to the edge dialect, list a graph's ops."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.fx as fx
from executorch.exir import EdgeProgramManager, to_edge
from executorch.exir.dialects.edge._ops import EdgeOpOverload


def edge_program(model: torch.nn.Module, args: tuple, dynamic_shapes=None) -> EdgeProgramManager:
    return to_edge(torch.export.export(model, args, dynamic_shapes=dynamic_shapes))


def op_names(gm: fx.GraphModule) -> list[str]:
    """The call_function targets of a graph, in order, as short names (`aten.add.Tensor`), the
    same whichever dialect (ATen, edge, backend) the graph is in."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            target = n.target._op if isinstance(n.target, EdgeOpOverload) else n.target
            out.append(str(target) if isinstance(target, torch._ops.OpOverload) else n.target.__name__)
    return out


def card_names(names: list[str]) -> list[str]:
    """`op_names` with etfuse's twins read as the ops they stand for (`etfuse.quantized_decomposed_add`
    -> `quantized_decomposed.add`): `transform(default_passes())` already holds the names a lowered
    program calls (passes/runtime_names.py), `fuse` the card's until `to_executorch()`."""
    return [n.replace("etfuse.quantized_decomposed_", "quantized_decomposed.") for n in names]


def plan_ops(program) -> list[str]:
    """The operator table of a lowered program's first execution plan: what the runtime must have."""
    return [f"{o.name}.{o.overload}" for o in program.executorch_program.execution_plan[0].operators]


def eval_with_bn_stats(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with non-trivial batch-norm running statistics (fixed seed), so a
    folded or fused batch norm shows in the numbers."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def assert_fused_matches_eager(model: torch.nn.Module, args: tuple, fused: EdgeProgramManager, **tol) -> None:
    """The fused program, its retrace to ATen (no etfuse op left) and its `.pte` on the ExecuTorch
    runtime each give eager's result, every output of it (`tol`: assert_close's, NaNs equal where
    eager's are; rtol=0, atol=0 for bit-exact). Lowers `fused` (to_executorch rewrites it in place)
    after the eager and retraced runs."""
    from etfuse.runtime import run

    want = model(*args)
    single = not isinstance(want, (tuple, list))
    retraced = fused.exported_program().run_decompositions()
    assert not [n for n in op_names(retraced.graph_module) if n.startswith("etfuse.")]
    tol = {"equal_nan": True, **tol}
    outputs = [("fused", fused.exported_program().module()(*args)), ("retraced", retraced.module()(*args))]
    on_runtime = run(fused.to_executorch(), args)
    outputs.append(("runtime", on_runtime[0] if single and len(on_runtime) == 1 else on_runtime))
    for name, got in outputs:
        torch.testing.assert_close(got if single else list(got), want if single else list(want),
                                   msg=lambda m, name=name: f"{name}: {m}", **tol)


def quantized_weight(n, k, group, bits, zero_points, seed=0, zp_range=(-3, 3)):
    """An int8 / int4 weight as torchao stores it and as linear_qw and linear_dq take it: (q, int8
    [N, K]; q itself or pack_int4(q); float32 scales [N, K / group]; int8 zero points in `zp_range`
    or None)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = torch.randint(lo, hi + 1, (n, k), dtype=torch.int8, generator=g)
    scales = torch.rand(n, k // group, generator=g) * 0.1 + 0.01
    zp = torch.randint(zp_range[0], zp_range[1] + 1, (n, k // group), dtype=torch.int8, generator=g) if zero_points else None
    packed = torch.ops.etfuse.pack_int4.out(q, out=torch.empty(0, dtype=torch.uint8)) if bits == 4 else q
    return q, packed, scales, zp


def weight_row_sums(weight, scales, zero_points, bits):
    """linear_dq's weight_row_sums for a weight as linear_qw holds it (int8, or pack_int4's bytes):
    each dequantized row's sum, sum_k (q - zp) * scale, in float64 rounded to float32."""
    from etfuse.backend_ops.weight_only_ops import _unpack_int4

    q = (_unpack_int4(weight) if bits == 4 else weight).double()
    n = q.shape[0]
    groups = scales.numel() // n
    d = q.reshape(n, groups, -1).sum(-1)
    if zero_points is not None:
        d = d - zero_points.reshape(n, groups).double() * (q.shape[1] // groups)
    return (d * scales.reshape(n, groups).double()).sum(-1).float()


class ResidualMlp(torch.nn.Module):
    """A transformer block's MLP with its skip connection: x + down(silu(up(x)))."""

    def __init__(self, bias):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 96, bias=bias), torch.nn.Linear(96, 64, bias=bias)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(x)))


def example_llama(kv_cache: bool, multiple_of: int = 16, dynamic_shape: bool = False) -> torch.nn.Module:
    """executorch's example llama, small (dim 64, 2 layers, 4 heads, vocab 97, 32 positions),
    seeded, in eval mode, without grad (export keeps requires_grad into a KV cache otherwise).
    `dynamic_shape`: ModelArgs.enable_dynamic_shape, as executorch's llama export sets it for a
    dynamic sequence length (the cache written with index_copy_ at input_pos[0], rope's tables
    and the mask narrowed there)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    model = construct_transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=97, max_seq_len=32,
                                            max_context_len=32, multiple_of=multiple_of,
                                            use_kv_cache=kv_cache, enable_dynamic_shape=dynamic_shape)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def llama_edge_program(model, dynamic: bool, kv_cache: bool = True):
    """example_llama as executorch's llama export writes it (LLMEdgeManager with
    enable_dynamic_shape): tokens [1, T] with T = Dim("token_dim", max=max_seq_len - 1) or static
    at its example's 3, and with a KV cache input_pos [1] static; strict export under the math
    SDPA without grad, decompositions run, then to_edge."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import etfuse

    token_dim = {1: torch.export.Dim("token_dim", max=32 - 1)}  # example_llama's max_seq_len
    if kv_cache:
        args = (torch.tensor([[2, 3, 4]]), {"input_pos": torch.tensor([0])})
        shapes = (token_dim, {"input_pos": {0: 1}}) if dynamic else None
    else:
        args, shapes = (torch.tensor([[2, 3, 4]]),), (token_dim,) if dynamic else None
    with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=shapes, strict=True).run_decompositions({})
    return etfuse.to_edge(ep)


def assert_greedy_decoding_matches_eager(method, eager: torch.nn.Module, steps: int, **tol) -> None:
    """A KV-cache llama's `.pte` method and its eager twin decode `steps` tokens greedily from
    token 1: each step's logits close (`tol`), and the same tokens."""
    token = want_token = 1
    got_tokens, want_tokens = [], []
    for pos in range(steps):
        logits = method.execute((torch.tensor([[token]]), torch.tensor([pos])))[0]
        want_logits = eager(torch.tensor([[want_token]]), {"input_pos": torch.tensor([pos])})
        torch.testing.assert_close(logits, want_logits, **tol)
        token, want_token = next_token(logits), next_token(want_logits)
        got_tokens.append(token)
        want_tokens.append(want_token)
    assert got_tokens == want_tokens
    assert len(set(want_tokens)) > 1, f"every step decoded {want_tokens[0]}: the loop checks one input only"


def next_token(logits: torch.Tensor) -> int:
    """Greedy decoding's next token: the argmax of the last row of logits [1, V] (executorch's
    llama returns the last position's only) or [1, T, V]."""
    return int(logits.reshape(-1, logits.shape[-1])[-1].argmax())


def benchmark_module(name: str):
    """benchmarks/<name>.py as a module: tests check the models the benchmarks time, not copies."""
    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_etfuse_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def pt2e_int8(model: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """`model` quantized the way XNNPACK users do it (PT2E, executorch's XNNPACK quantizer,
    per-channel symmetric int8 weights, int8 activations), calibrated on `args`, exported."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    m = torch.export.export(model, args).module()
    m = prepare_pt2e(m, XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    m(*args)
    return torch.export.export(convert_pt2e(m), args)
