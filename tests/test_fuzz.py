"""Property-based fuzzing: random small models, each run four ways (eager, the fused program in
torch eager, the unfused program on the ExecuTorch runtime, the fused one on the runtime).

The generator and the comparison live in `fuzz_models.py` (shared with `benchmarks/fuzz.py`,
which runs the same generator for thousands of graphs in subprocesses). Here hypothesis drives
it with a fixed seed (`derandomize=True`) and budgets of `FUZZ_EXAMPLES` + `INT8_EXAMPLES`
graphs, sized so this file stays within a few minutes on CI's 2 cores (each graph costs seconds
of export, to_edge, fuse and two to_executorch lowerings). A failure is shrunk to a minimal
model, printed as a small program (`ModelSpec.__repr__`).

An etfuse-caused mismatch (the fused program differs while the unfused runtime matches eager) and
an etfuse error fail the test. A stock-runtime bug (the unfused runtime is the one that is wrong)
and programs the stock runtime cannot lower are expected; models that cannot be exported are
skipped with `assume`.
"""

import functools
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st

import fuzz_models as fm

# Each graph costs seconds (export, to_edge, fuse, two to_executorch lowerings; int8 ones also
# prepare/convert_pt2e): measured on 2 busy cores (a 1-job fuzz run and three other engineers'
# work alongside) ~8-13 s per float graph, ~17 s per int8 graph, plus ~40 s of first-use warm-up:
# 14 float + 4 int8 graphs took 4 min 43 s for this file, so 10 + 4 (~4 min). benchmarks/fuzz.py runs the same generator for thousands. Raise with
# ETFUSE_FUZZ_EXAMPLES / ETFUSE_FUZZ_INT8_EXAMPLES.
FUZZ_EXAMPLES = int(os.environ.get("ETFUSE_FUZZ_EXAMPLES", "10"))
INT8_EXAMPLES = int(os.environ.get("ETFUSE_FUZZ_INT8_EXAMPLES", "4"))
SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return fm.kernels()


@functools.lru_cache(maxsize=None)
def _outcome(spec):
    return fm.check(spec)


def _check(spec):
    outcome = _outcome(spec)
    event(f"outcome: {outcome.kind}")
    event(f"model: {'int8 ' if spec.quant else ''}{'control flow' if spec.has_control_flow else 'straight-line'}")
    event(f"fused backend ops: {'yes' if outcome.fused_ops else 'none'}")
    assume(outcome.kind != fm.SKIP)
    assert outcome.kind not in fm.FAILURES, f"{outcome}\n{spec!r}"


@settings(max_examples=FUZZ_EXAMPLES, phases=[Phase.explicit, Phase.reuse, Phase.generate], **SETTINGS)
@given(st.integers(0, 2**32 - 1))
def test_fused_programs_match_eager_and_the_unfused_runtime(seed):
    """Any model (int8 ones too), drawn as `benchmarks/fuzz.py` draws them: hypothesis' own
    choice-by-choice drawing (`fm.strategy()`) concentrates on trivial models at this budget (in
    25 examples 1 had a fused op, against 4 in 10 from a seeded `random.Random`), so hypothesis
    draws the seed and a failure is shrunk by `fm.shrink` (one op / body op / output at a time)."""
    spec = fm.generate(fm.RandomDraw(random.Random(seed)))
    outcome = _outcome(spec)
    event(f"outcome: {outcome.kind}")
    event(f"fused backend ops: {'yes' if outcome.fused_ops else 'none'}")
    assume(outcome.kind != fm.SKIP)
    if outcome.kind in fm.FAILURES:
        small = fm.shrink(spec, lambda s: _outcome(s).kind == outcome.kind, log=lambda m: None)
        raise AssertionError(f"{outcome}\n{spec!r}\nshrunk to:\n{small!r}\n{_outcome(small)}")


@settings(max_examples=INT8_EXAMPLES, **SETTINGS)
@given(fm.strategy(quant=True))
def test_int8_fused_programs_match_the_unfused_runtime_within_a_step(spec):
    """PT2E int8 models, drawn choice by choice (hypothesis shrinks a failure to a minimal model)."""
    _check(spec)



def test_generator_is_deterministic_and_readable():
    import random

    a = fm.generate(fm.RandomDraw(random.Random("0-7")))
    b = fm.generate(fm.RandomDraw(random.Random("0-7")))
    assert a == b and repr(a) == repr(b)
    text = repr(a)
    assert text.startswith("ModelSpec(shape=") and "  v0 = input" in text and "  return v" in text


def test_the_generator_covers_every_op_kind():
    import random

    seen, quant = set(), 0
    for i in range(300):
        spec = fm.generate(fm.RandomDraw(random.Random(f"cover-{i}")))
        seen |= {op.kind for op in spec.ops}
        seen |= {(op.kind, p) for op in spec.ops for p in op.params if p in ("bn", "dw")}
        quant += spec.quant
    assert set(fm.TOP_KINDS) <= seen
    assert {("linear", "bn"), ("conv", "bn"), ("conv", "dw")} <= seen
    assert quant > 10


def test_check_catches_a_wrong_fused_program(monkeypatch):
    """The comparison is not vacuous: a fusion that changes results is an etfuse mismatch."""
    import etfuse
    import torch

    spec = fm.ModelSpec(shape=(2, 4), inputs=((2, 4), (2, 4)), ops=(fm.Op("add", (0, 1)), fm.Op("relu", (2,))),
                        outputs=(3,))
    assert fm.check(spec).kind == fm.PASS
    real_fuse = etfuse.fuse

    def wrong_fuse(program, passes=None):
        fused = real_fuse(program, passes)
        for n in fused.exported_program().graph.nodes:
            if n.op == "call_function" and "add_relu" in str(n.target):
                n.target = torch.ops.etfuse.add_relu.default  # fine so far: now break it
                n.args = (n.args[0], n.args[0])
        fused.exported_program().graph_module.recompile()
        return fused

    monkeypatch.setattr(etfuse, "fuse", wrong_fuse)
    outcome = fm.check(spec)
    assert outcome.kind == fm.ETFUSE_MISMATCH, outcome


def test_a_failure_shrinks_to_a_minimal_model_and_a_reproducer_script():
    """The shrinker (what benchmarks/fuzz.py runs on each etfuse failure) reduces a model to the
    ops the failure needs, blocks and cond bodies included, and `reproducer` writes a script that
    rebuilds exactly that model. (The predicate stands in for `check`: no export here.)"""
    import random

    spec = next(s for i in range(500) for s in [fm.generate(fm.RandomDraw(random.Random(f"shrink-{i}")))]
                if any(n == "gemm" for n, _ in s.blocks()) and len(s.ops) >= 4)

    def has_gemm(s):
        return any(n == "gemm" for n, _ in s.blocks())

    small = fm.shrink(spec, has_gemm, log=lambda m: None)
    assert has_gemm(small) and len(small.ops) == 1 and len(small.outputs) == 1 and small.seed == 0
    namespace = {}
    script = fm.reproducer(small, fm.Outcome(fm.ETFUSE_MISMATCH, "made up"))
    exec(compile(script.replace('if __name__ == "__main__":', "if False:"), "repro", "exec"), namespace)
    assert namespace["spec"] == small


def test_blocks_are_drawn_readably_and_deterministically():
    import random

    from fuzz_blocks import BLOCKS

    texts = set()
    for i in range(200):
        a = fm.generate(fm.RandomDraw(random.Random(f"b-{i}")))
        assert a == fm.generate(fm.RandomDraw(random.Random(f"b-{i}")))
        texts |= {line.split("=", 1)[1].split("(")[0].strip() for line in repr(a).splitlines()[1:] if " = " in line}
    assert set(BLOCKS) & texts, texts  # a block prints as its name: v3 = gemm(v2, silu, bias)


def test_fusing_the_fused_program_again_changes_nothing():
    """Fuzz seed 44 graph 68 (issue 44): two rotary embeddings' cos / sin slices are unsqueeze
    copies of one tensor that UnitDimViewsPass turns into equal view_copy nodes; with
    CommonSubexpressionPass before it they stayed two nodes and fusing again merged them."""
    import etfuse

    fm.kernels()
    spec = fm.ModelSpec((1, 1, 5, 4), ((1, 1, 5, 4),),
                        (fm.Op("block", (0,), ("rope", 0)), fm.Op("block", (1,), ("rope", 1))), (2,), seed=2)
    fused = etfuse.fuse(fm.export_edge(spec))
    assert fm.op_list(etfuse.fuse(fused).exported_program()) == fm.op_list(fused.exported_program())


def test_fusing_again_keeps_the_copies_the_compat_passes_inserted():
    """Fuzz seed 44 graph 2085, shrunk (issue 44): a scan result read by a view (CondViewCopyPass
    copies it) and carried into a while loop (export copies it): fusing the fused program again
    merged the two copies (CommonSubexpressionPass), so fusing twice differed from fusing once."""
    import etfuse

    fm.kernels()
    spec = fm.ModelSpec(
        shape=(2, 2, 1), inputs=((2, 2, 1),),
        ops=(fm.Op("scalar", (0,), ("rsub", 1.0)), fm.Op("relu", (0,)), fm.Op("linear", (1,), (True, "")),
             fm.Op("scan", (0, 3), ("ys",), ((fm.Op("relu", ("a",)), fm.Op("scalar", (0,), ("rsub", 1.0))),)),
             fm.Op("block", (4,), ("permute", False, (0, 2, 1))),
             fm.Op("while", (4, 2), (2,), ((fm.Op("block", ("a",), ("gated", 1, 1)), fm.Op("add", ("b", "a")),
                                            fm.Op("sub", (1, 0)), fm.Op("mul", ("b", 2))),))),
        outputs=(6, 5))
    fused = etfuse.fuse(fm.export_edge(spec))
    once = fm.op_list(fused.exported_program())
    assert once.count("dim_order_ops._clone_dim_order.default") >= 2, once  # both copies are there
    assert fm.op_list(etfuse.fuse(fused).exported_program()) == once


def test_a_stock_kernel_wrong_upstream_of_an_output_is_a_stock_bug_when_the_whole_program_cannot_run():
    """Fuzz seed 44 graph 2551, shrunk (issue 44): a channels-last input's unsqueeze -> permute is
    wrong on the stock runtime (its unsqueeze_copy kernel), in the fused program too; the stock
    program as a whole cannot run (an int8 add of mixed dim orders), so the check runs the stock
    program of the wrong output alone: wrong the same way, a stock bug, not etfuse's."""
    fm.kernels()
    spec = fm.ModelSpec(shape=(2, 4, 5, 5), inputs=((2, 4, 5, 5), (5,), (5,)),
                        ops=(fm.Op("block", (0,), ("permute", True, (1, 3, 2, 0, 4))),
                             fm.Op("block", (0,), ("qadd_scalar", "int", "int8"))),
                        outputs=(4, 3), layout="channels_last")
    outcome = fm.check(spec)
    assert outcome.kind == fm.STOCK_BUG and outcome.fused_ok is False, outcome
    assert "outputs [1] alone, on the stock runtime" in outcome.detail


def test_equal_constants_of_two_branches_stay_two_operands_of_the_cond():
    """Fuzz seed 44 graph 2770, shrunk (issue 44): each branch of a cond holds a quantized conv whose
    weight scales and zero points equal the other's; CommonSubexpressionPass stored them once and
    gave the cond one tensor as two operands, which torch cannot retrace ("cond_true might be
    aliasing the input or the output!")."""
    import etfuse

    fm.kernels()
    spec = fm.ModelSpec(shape=(1, 2, 5, 4), inputs=((1, 2, 5, 4),), ops=(fm.Op("cond", (0, 0, 0), (), (
        (fm.Op("block", ("a",), ("qgemm", "requant_relu", True, 3, (-0.5, 0.25), "int8")),),
        (fm.Op("block", ("a",), ("qgemm", "requant_relu", True, 1, (0.0, 6.0), "int8")),))),), outputs=(1,))
    fused = etfuse.fuse(fm.export_edge(spec))
    (cond,) = [n for n in fused.exported_program().graph.nodes if n.target is torch.ops.higher_order.cond]
    operands = cond.args[3]
    assert len(set(operands)) == len(operands), operands
    fused.exported_program().run_decompositions()
    outcome = fm.check(spec)
    assert outcome.kind == fm.PASS, outcome


def test_a_transposed_result_of_a_cond_read_by_another_is_copied_in_its_own_strides():
    """Fuzz seed 44 graph 7361, shrunk (issue 44): a cond over a transposed [2, 8] input (dim order
    [1, 0]) whose result a second cond reads. CondOutputCopyPass copied the result with its dim
    order, [1, 0], which executorch maps to no memory format: `etfuse.fuse` raised while
    verifying the node it wrote. The copy now keeps the result's strides (dim_order None)."""
    fm.kernels()
    spec = fm.ModelSpec(shape=(2, 8), inputs=((2, 8), (), (1, 1)), ops=(
        fm.Op("cond", (1, 0, 2), (), ((fm.Op("block", ("a",), ("qadd_scalar", "float", "uint8")),),
                                      (fm.Op("add", ("b", "a")),))),
        fm.Op("cond", (3, 3, 3), (), ((fm.Op("clamp", ("a",), (0.0, None)),), (fm.Op("add", ("b", "b")),)))),
        outputs=(4,), layout="transposed")
    outcome = fm.check(spec, routes=True)
    assert outcome.kind not in fm.FAILURES, outcome


def test_a_cache_write_into_a_copy_leaves_the_source_alone_on_the_runtime():
    """Fuzz seed 44 graph 149 (issue 44): `c = h.clone(); c[:, pos] = v; return c, h` gave a wrong h on
    the runtime: DropIdentityCopiesPass dropped the clone and to_executorch ran the fused
    update_cache in place on h's buffer. The copy stays where its user may run in place."""
    fm.kernels()
    s = (2, 3, 4, 5)
    spec = fm.ModelSpec(s, (s,), (fm.Op("relu", (0,)), fm.Op("block", (1,), ("kv_cache", 0))), (2, 1))
    outcome = fm.check(spec)
    assert outcome.kind == fm.PASS, outcome


def test_an_8bit_group_embedding_whose_q_minus_zp_wraps_in_int8_is_not_fused_differently():
    """Fuzz seed 44 graph 248 (issue 44): dequantize_per_channel_group subtracts an int8 zero point
    in int8 (q 100, zp -100 -> -56); the fused op subtracts exactly, so the rule must decline."""
    fm.kernels()
    spec = fm.ModelSpec((2, 3, 4), ((2, 3, 4),), (fm.Op("block", (0,), ("embedding", "group", 8, False, True)),), (1,),
                        seed=3)
    outcome = fm.check(spec)
    assert outcome.kind != fm.ETFUSE_MISMATCH, outcome


def test_a_cache_write_read_by_a_while_loop_is_right_on_the_runtime():
    """Fuzz seed 44 graph 149, shrunk (issue 44): `c = x1.clone(); c[:, pos] = v; while i < 3:
    acc = hardtanh(c)` was wrong on the fused runtime: the in-place update_cache_'s storage ended
    its lifetime at the update, and the loop's output was planned over the operand it reads
    (passes/inplace_updates.py keeps such a write functional)."""
    fm.kernels()
    s = (2, 3, 4, 5)
    spec = fm.ModelSpec(s, (s, s), (fm.Op("block", (1,), ("kv_cache", 0)),
                                    fm.Op("while", (0, 2), (3,), ((fm.Op("hardtanh", ("b",), (-0.5, 2.0)),),))), (3,))
    outcome = fm.check(spec)
    assert outcome.kind == fm.PASS, outcome


def test_a_returned_cache_write_beside_a_cond_is_right_on_the_runtime():
    """Fuzz seed 47 graph 396, shrunk (issue 44): a KV-cache write of x returned as an output, beside
    `cond(..., x, ...)` whose result feeds a linear, was wrong on the fused runtime (all 75 values of
    the cache): the in-place update_cache_'s storage ended its lifetime at the update and the
    cond's output was planned over it. A program with control flow stays functional
    (passes/inplace_updates.py)."""
    fm.kernels()
    spec = fm.ModelSpec(
        shape=(1, 3, 5, 5), inputs=((1, 3, 5, 5), (1, 3, 1, 1), (1, 3, 1, 1)),
        ops=(fm.Op("cond", (2, 0, 2), (), ((fm.Op("block", ("a",), ("norm", "layer_affine")),),
                                            (fm.Op("add", ("b", "a")),))),
             fm.Op("clamp", (3,), (-1.0, 1.0)), fm.Op("block", (0,), ("kv_cache", 1)), fm.Op("linear", (4,), (True, "")),
             fm.Op("hardtanh", (6,), (-1.0, 1.0))),
        outputs=(7, 5))
    outcome = fm.check(spec)
    assert outcome.kind == fm.PASS, outcome


def test_the_config_route_lowers_a_loop_whose_carry_depends_on_a_parameter():
    """Fuzz routes check (issue 44): `while i < 2: acc = relu(linear(acc)) * x` raised in
    `edge.to_executorch(ExecutorchBackendConfig(passes=default_passes()))` ("outs_to_grad length (1)
    != tangents length (2)"): executorch's own passes after LoopLoweringPass retrace the scan with
    grad enabled, from placeholder values where the linear's parameters require grad. The lowered
    program's placeholder values no longer require grad; every route lowers and runs it."""
    fm.kernels()
    s = (3, 4)
    spec = fm.ModelSpec(s, (s,), (fm.Op("while", (0, 0), (2,), ((fm.Op("block", ("a",), ("gemm", "relu", True, False, "none")),
                                                                 fm.Op("mul", (0, "b"))),)),), (1,))
    outcome = fm.check(spec, routes=True)
    assert outcome.kind == fm.PASS, outcome


def test_the_config_route_lowers_a_group_embedding_with_zero_points():
    """Fuzz routes check (issue 44), coverage sample model 55 shrunk: a 2-bit group-quantized
    embedding with zero points (all in its quant range [-2, 1], so q - zp cannot wrap in int8).
    The config route hands the passes no values: unseen int8 zero points may lie anywhere in int8,
    so embedding_2bit_group_int8_zp fuses it (its op wraps as the pattern does; declining left
    dequantize_per_channel_group, which the stock runtime has no kernel for)."""
    from executorch.exir import ExecutorchBackendConfig

    from etfuse.passes import default_passes

    fm.kernels()
    spec = fm.ModelSpec((2, 3), ((2, 3),), (fm.Op("block", (0,), ("embedding", "group", 2, False, True)),), (1,))
    fm.export_edge(spec).to_executorch(ExecutorchBackendConfig(passes=default_passes()))


def test_the_config_route_lowers_an_8bit_group_embedding_with_zero_zero_points():
    """Fuzz routes check (issue 44), after 737bf1b: the 8-bit form of the test above, zero points
    an int8 tensor of zeros (a symmetric table as torchao / quantized_decomposed leave it). The
    config route cannot see them, so q - zp may wrap in int8 where the pattern subtracts:
    embedding_byte_group_int8_zp fuses it (its op wraps as the pattern does)."""
    from executorch.exir import ExecutorchBackendConfig

    from etfuse.passes import default_passes

    fm.kernels()
    spec = fm.ModelSpec((2, 3), ((2, 3),), (fm.Op("block", (0,), ("embedding", "group", 8, False, False)),), (1,))
    fm.export_edge(spec).to_executorch(ExecutorchBackendConfig(passes=default_passes()))
    # every route's .pte runs and matches eager (the unfused program has no stock kernel to run on)
    outcome = fm.check(spec, routes=True)
    assert outcome.kind == fm.STOCK_ERROR and outcome.fused_ok, outcome
    assert outcome.rules == {"etfuse::embedding_byte_group_int8_zp": 1}, outcome


@pytest.mark.parametrize("bits", [4, 2])
def test_every_route_fuses_a_sub_byte_group_embedding_with_int8_zero_points_outside_its_range(bits):
    """Fuzz draw "wide" (issue 44): a 4- or 2-bit group embedding whose int8 zero points lie
    anywhere in int8 (one at -128: q - zp wraps in int8 in dequantize_per_channel_group). Every
    route fuses it with embedding_{4bit,2bit}_group_int8_zp and its `.pte` matches eager."""
    fm.kernels()
    spec = fm.ModelSpec((2, 3), ((2, 3),), (fm.Op("block", (0,), ("embedding", "group", bits, False, "wide")),), (1,))
    outcome = fm.check(spec, routes=True)
    assert outcome.kind == fm.STOCK_ERROR and outcome.fused_ok, outcome
    assert outcome.rules == {f"function::embedding_{bits}bit_group_int8_zp": 1}, outcome


def test_check_compares_the_routes(monkeypatch):
    """The routes check is not vacuous: an `edge.transform` route that left out FusionPass gives another
    `.pte` operator plan, an etfuse routes failure."""
    from executorch.exir import EdgeProgramManager

    from etfuse.passes import FusionPass

    fm.kernels()
    spec = fm.ModelSpec(shape=(2, 4), inputs=((2, 4), (2, 4)), ops=(fm.Op("add", (0, 1)), fm.Op("relu", (2,))),
                        outputs=(3,))
    assert fm.check(spec, routes=True).kind == fm.PASS
    real = EdgeProgramManager.transform
    monkeypatch.setattr(EdgeProgramManager, "transform",
                        lambda self, passes, *a, **k: real(self, [p for p in passes if not isinstance(p, FusionPass)], *a, **k))
    outcome = fm.check(spec, routes=True)
    assert outcome.kind == fm.ETFUSE_ROUTES and "operator plans differ" in outcome.detail, outcome


def test_a_dynamic_batch_runs_at_every_size_and_lowers_its_shape_arithmetic():
    """A model exported with a dynamic batch (`ModelSpec.dynamic_batch`) is checked at S's batch, the
    Dim's ends and one size inside; its shape arithmetic goes through SymIntToPrimsPass. The generator
    draws dynamic batches."""
    import random

    fm.kernels()
    s = (3, 2, 4)
    spec = fm.ModelSpec(s, (s, (3, 1, 1)), (fm.Op("block", (0,), ("symshape", "scale")), fm.Op("add", (2, 1)),
                                            fm.Op("block", (3,), ("gemm", "relu", True, False, "none"))),
                        (4,), dynamic_batch=(2, 7))
    assert spec.batch_sizes() == (3, 2, 7, 5) and spec.dynamic_shapes()["inputs"][1] is not None
    assert [t.shape[0] for t in fm.example_inputs(spec, 0, 7)] == [7, 7]
    outcome = fm.check(spec)
    assert outcome.kind == fm.PASS and "SymIntToPrimsPass" in outcome.passes, outcome
    drawn = [fm.generate(fm.RandomDraw(random.Random(f"dyn-{i}"))) for i in range(200)]
    assert sum(bool(d.dynamic_batch) for d in drawn) >= 10


def _add_relu_spec():
    return fm.ModelSpec(shape=(2, 4), inputs=((2, 4), (2, 4)), ops=(fm.Op("add", (0, 1)), fm.Op("relu", (2,))),
                        outputs=(3,))


def test_the_aarch64_check_compares_the_runner_with_the_x86_runtime(monkeypatch):
    """The aarch64 check is not vacuous: runner outputs off by more than the tolerance, or a runner
    that fails, are an etfuse_aarch64 failure (no qemu needed: the runner's result is made up)."""
    fm.kernels()
    spec = _add_relu_spec()
    monkeypatch.setattr(fm, "run_aarch64", lambda runner, pte, inputs, like: [t.clone() for t in like])
    assert fm.check(spec, aarch64=["runner"]).aarch64
    monkeypatch.setattr(fm, "run_aarch64", lambda runner, pte, inputs, like: [t + 0.01 for t in like])
    outcome = fm.check(spec, aarch64=["runner"])
    assert outcome.kind == fm.ETFUSE_AARCH64 and "aarch64 runner vs x86 fused runtime" in outcome.detail, outcome
    monkeypatch.setattr(fm, "run_aarch64", lambda runner, pte, inputs, like: "the runner exited 1: boom")
    assert fm.check(spec, aarch64=["runner"]).kind == fm.ETFUSE_AARCH64


def test_fuzzed_programs_run_alike_on_the_aarch64_runner():
    """A fixed sample of generated models (float and int8) through the README's C++ app built for
    aarch64, under qemu-aarch64 -cpu neoverse-n1: the fused .pte's outputs there equal the x86 fused
    runtime's within the fused-vs-eager tolerance (benchmarks/fuzz.py --aarch64-every runs it at scale)."""
    import readme_consumer

    fm.kernels()
    runner = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", "neoverse-n1", str(readme_consumer.app("aarch64"))]
    checked = {False: 0, True: 0}  # float, int8
    for i in range(40):
        spec = fm.generate(fm.RandomDraw(random.Random(f"aarch64-{i}")), quant=checked[False] >= 3)
        if spec.dynamic_shapes() is not None or checked[bool(spec.quant)] >= 3:
            continue
        outcome = fm.check(spec, routes=False, aarch64=runner)
        assert outcome.kind not in fm.FAILURES, f"{outcome}\n{spec!r}"
        if outcome.aarch64 and outcome.fused_ops:
            checked[bool(spec.quant)] += 1
        if min(checked.values()) >= 3:
            break
    assert min(checked.values()) >= 3, checked


def _fuzz_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("fuzz_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_run_resumes_from_its_results_file(tmp_path, capsys):
    """`benchmarks/fuzz.py --results F` (the 10,000-graph run, over several sittings): every graph's
    result goes to F with the code fingerprint; a second run skips the graphs in F and counts them
    in its summary; F from another code is refused, naming the file, the graph and both codes."""
    import json

    fuzz = _fuzz_script()
    results = tmp_path / "results.jsonl"
    args = ["--seed", "44", "--jobs", "1", "--no-shrink", "--results", str(results)]
    assert fuzz.main(["--graphs", "1", *args]) == 0
    code = fuzz.code_fingerprint()
    assert [(r["i"], r["code"]) for r in map(json.loads, results.read_text().splitlines())] == [(0, code)]
    capsys.readouterr()
    assert fuzz.main(["--graphs", "2", *args]) == 0
    out = capsys.readouterr().out
    assert f"code {code}; 1 graphs from {results}, 1 to run" in out
    assert "[final] graphs=2/2 " in out
    assert [r["i"] for r in map(json.loads, results.read_text().splitlines())] == [0, 1]
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"i": 0, "kind": "pass", "code": "0" * 16}) + "\n")
    with pytest.raises(SystemExit, match=f"old.jsonl:1: graph 0 was checked at code {'0' * 16}, this checkout is {code}"):
        fuzz.main(["--graphs", "1", *args[:-1], str(old)])


def test_a_worker_is_replaced_by_a_fresh_one_after_recycle_graphs(tmp_path, monkeypatch):
    """`--recycle N`: a worker's heap grows with every graph and slows it down, so after N graphs
    the run goes on in a fresh worker process; every graph is still run once."""
    import json

    fuzz = _fuzz_script()
    started = []

    class CountedWorker(fuzz.Worker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.proc.pid)

    monkeypatch.setattr(fuzz, "Worker", CountedWorker)
    results = tmp_path / "results.jsonl"
    assert fuzz.main(["--graphs", "3", "--seed", "44", "--jobs", "1", "--no-shrink", "--recycle", "2",
                      "--results", str(results)]) == 0
    assert len(set(started)) == 2, started
    assert [json.loads(line)["i"] for line in results.read_text().splitlines()] == [0, 1, 2]


def test_a_fused_runtime_wrong_as_the_stock_one_is_a_stock_bug_and_wrong_otherwise_is_etfuses(monkeypatch):
    """Seed 44 graph 1824 (a scan over symshape) is wrong on the stock runtime and, with nothing
    fused there, as wrong on the fused one, the same values: a stock bug. A fused runtime that gave
    other wrong values is an etfuse mismatch, not hidden in the stock-bug count (issue 44)."""
    import etfuse.runtime

    spec = _fuzz_script().spec_for(44, 1824)
    outcome = fm.check(spec, routes=False)
    assert outcome.kind == fm.STOCK_BUG and outcome.fused_ok is False, outcome
    # the second program check loads is the fused one: its outputs shifted by 1
    loaded, load = [], etfuse.runtime.load_method

    def shifted_second(*a, **k):
        method = load(*a, **k)
        loaded.append(method)
        if len(loaded) == 2:
            execute = method.execute
            method.execute = lambda inputs: [t + 1 for t in execute(inputs)]
        return method

    monkeypatch.setattr(etfuse.runtime, "load_method", shifted_second)
    outcome = fm.check(spec, routes=False)
    assert outcome.kind == fm.ETFUSE_MISMATCH, outcome
    assert "fused runtime vs eager and vs the stock runtime, which is wrong too (input set 0; outputs [0])" in outcome.detail
    # and a fused runtime that raises where the stock one runs is an etfuse error
    loaded.clear()

    def failing(inputs):
        raise RuntimeError("method->execute() failed with error 0x12")

    def raising_second(*a, **k):
        method = load(*a, **k)
        loaded.append(method)
        if len(loaded) == 2:
            method.execute = failing
        return method

    monkeypatch.setattr(etfuse.runtime, "load_method", raising_second)
    outcome = fm.check(spec, routes=False)
    assert outcome.kind == fm.ETFUSE_ERROR and "where the stock runtime runs" in outcome.detail, outcome


def test_code_fingerprint_follows_the_sources(tmp_path):
    """The fingerprint changes with a rule's source and not with a build output or a cache."""
    fuzz = _fuzz_script()
    (tmp_path / "patterns" / "__pycache__").mkdir(parents=True)
    rule = tmp_path / "patterns" / "rules.py"
    rule.write_text("A = 1\n")
    before = fuzz.code_fingerprint(tmp_path)
    (tmp_path / "patterns" / "__pycache__" / "rules.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "patterns" / "build").mkdir()
    (tmp_path / "patterns" / "build" / "x.cpp").write_text("int x;\n")
    assert fuzz.code_fingerprint(tmp_path) == before
    rule.write_text("A = 2\n")
    assert fuzz.code_fingerprint(tmp_path) != before
