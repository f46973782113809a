"""The fuzz generator reaches every fusion rule and every pass (issue 44).

A fixed sample (`fuzz_models.coverage_sample(seed=0)`: every building block of
tests/fuzz_blocks.py with every combination of its key choices, float and PT2E int8, plus the
control-flow specs the passes need: blocks in cond / while / scan bodies, a dynamic batch) is exported, lowered and fused with the fusion report
(`FusionPass.report`) and with each pass of `default_passes()` watched for a change of the
graph. The test fails naming every rule of `etfuse.patterns.RULES` (by key) and every pass that
the sample never exercised, so a new rule or pass without a generator block fails here.

Rules and passes the sample cannot reach yet are listed below with the reason; an entry that the
sample does reach fails the test too (delete it).

Cost: 54 models of up to 16 blocks, 140 s user (78 models of up to 8 blocks took 159 s, the same
coverage: an export's fixed cost is small beside its blocks'); the int8 ones (prepare/convert_pt2e)
are ~40%.
"""

from __future__ import annotations

import collections
import time

import pytest

import fuzz_models as fm

# rule key -> why the sample does not reach it
NOT_REACHED_RULES: dict = {
    # (empty) The six int8 requant_relu / hardtanh conv and linear rules that the XNNPACK quantizer
    # never leaves (relu after a conv / linear is annotated with it, hardtanh gets its own quantize)
    # are reached by fuzz_blocks' QuantGemm block, which spells them on quantized_decomposed ops.
}

# pass class name -> why the sample does not reach it
NOT_REACHED_PASSES: dict = {
    # (empty) SymIntToPrimsPass is reached by the sample's dynamic-batch model (fuzz_blocks' SymShape).
}


@pytest.fixture(scope="module")
def coverage():
    fm.kernels()
    rules, passes, failed = collections.Counter(), set(), []
    t0 = time.time()
    specs = fm.coverage_sample(seed=0)
    for spec in specs:
        try:
            _, fired, changed = fm.fuse_instrumented(fm.export_edge(spec))
        except Exception as e:  # noqa: BLE001
            failed.append(f"{fm._err(e)}\n{spec!r}")
            continue
        rules.update(fired)
        passes |= changed
    return rules, passes, failed, len(specs), time.time() - t0


def test_every_sample_model_exports_and_fuses(coverage):
    _, _, failed, n, _ = coverage
    assert not failed, f"{len(failed)} of {n} sample models failed:\n" + "\n\n".join(failed)


def test_the_sample_fires_every_rule(coverage):
    from etfuse.patterns import RULES

    rules, _, _, n, seconds = coverage
    keys = [r.key for r in RULES]
    assert set(NOT_REACHED_RULES) <= set(keys), f"listed but not rules: {sorted(set(NOT_REACHED_RULES) - set(keys))}"
    missing = [k for k in keys if k not in rules and k not in NOT_REACHED_RULES]
    assert not missing, (f"{len(missing)} rule(s) never fired in the {n}-model coverage sample ({seconds:.0f} s): "
                         f"{missing}; add a block to tests/fuzz_blocks.py that spells them")
    reached = [k for k in NOT_REACHED_RULES if k in rules]
    assert not reached, f"listed as not reached but fired: {reached}; delete them from NOT_REACHED_RULES"


def test_the_sample_changes_the_graph_in_every_pass(coverage):
    from etfuse.passes import default_passes

    _, passes, _, n, _ = coverage
    names = [type(p).__name__ for p in default_passes()]
    missing = [p for p in names if p not in passes and p not in NOT_REACHED_PASSES]
    assert not missing, f"pass(es) that changed no graph of the {n}-model coverage sample: {missing}"
    reached = [p for p in NOT_REACHED_PASSES if p in passes]
    assert not reached, f"listed as not reached but changed a graph: {reached}; delete them from NOT_REACHED_PASSES"


def test_the_random_generator_draws_every_block_and_key_choice():
    """The random generator (benchmarks/fuzz.py, test_fuzz.py) draws every block the sample
    enumerates: 2,000 specs, no export (fast)."""
    import random

    from fuzz_blocks import BLOCKS

    seen = collections.Counter()
    for i in range(2000):
        spec = fm.generate(fm.RandomDraw(random.Random(f"blocks-{i}")))
        seen.update(name for name, _ in spec.blocks())
    assert set(BLOCKS) <= set(seen), f"never drawn: {sorted(set(BLOCKS) - set(seen))}"
