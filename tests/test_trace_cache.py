"""patterns/trace_cache.py: the on-disk cache of traced patterns. A new process reads its rule
table's edge graphs instead of exporting them again; what it cannot use it traces.
(That every rule of the table round-trips is checked in test_rules.py, beside the full trace.)"""

import os
from pathlib import Path
from unittest import mock

import pytest
import torch

from etfuse.backend_ops import BackendOp, install
from etfuse.patterns import RULES, Rule, rule as rule_module, trace as trace_module, trace_cache


def _sample():
    """A pattern with a BackendOp replacement, a QuantRule (dtype parameters), a function replacement."""
    # conv1d: a function replacement that no rule-level cache of its own holds (EmbeddingRule's does)
    with_function = next(r for r in RULES if not isinstance(r.replacement, BackendOp) and r.name.startswith("conv1d"))
    quant = next(r for r in RULES if getattr(r, "dtypes", None))
    return [RULES[-1], quant, with_function]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """An empty pattern cache of the test's own, and this process's traces forgotten."""
    install()
    monkeypatch.setenv("ETFUSE_PATTERN_CACHE", str(tmp_path))
    monkeypatch.setattr(trace_cache, "_LOADED", {})
    monkeypatch.setattr(rule_module, "_TRACED", {})
    monkeypatch.setattr(rule_module, "_TRACED_REPLACEMENTS", {})
    return tmp_path


def _new_process():
    trace_cache._LOADED.clear()
    rule_module._TRACED.clear()
    rule_module._TRACED_REPLACEMENTS.clear()


def _no_export():
    return mock.patch.object(trace_module, "_to_edge", side_effect=AssertionError("exported"))


def test_a_warm_cache_needs_no_export(cache_dir):
    rules = _sample()
    traced = [str(p.graph) for p in rule_module.edge_patterns(rules)]
    replacement = str(rules[2].replacement_graph().graph)
    assert sorted(f.split(".")[1] for f in os.listdir(cache_dir)) == ["patterns", "replacements"]
    _new_process()
    with _no_export():
        assert [str(p.graph) for p in rule_module.edge_patterns(rules)] == traced
        assert str(rules[2].replacement_graph().graph) == replacement


def test_a_damaged_file_is_traced_again_and_replaced(cache_dir):
    rule = RULES[-1]
    expected = str(rule.edge_pattern().graph)
    (path,) = [os.path.join(cache_dir, f) for f in os.listdir(cache_dir)]
    with open(path, "wb") as f:
        f.write(b"\x80\x04not a pickle")
    _new_process()
    assert str(rule.edge_pattern().graph) == expected
    _new_process()
    with _no_export():
        assert str(rule.edge_pattern().graph) == expected


def test_a_users_rule_is_not_stored(cache_dir):
    def pattern(x, y):
        return torch.ops.aten.relu.default(torch.ops.aten.sub.Tensor(x, y))

    def replacement(x, y):
        return torch.ops.aten.relu.default(torch.ops.aten.sub.Tensor(x, y))

    mine = Rule("sub_relu", pattern, replacement, lambda: (torch.randn(4), torch.randn(4)))
    assert trace_cache.rule_id(mine, False) is None
    mine.edge_pattern()
    assert os.listdir(cache_dir) == []


def test_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("ETFUSE_PATTERN_CACHE", "off")
    RULES[-1].edge_pattern()
    assert os.listdir(cache_dir) == []


def test_the_key_changes_with_the_source():
    first = trace_cache.fingerprint()
    trace_cache.fingerprint.cache_clear()
    real = Path.read_bytes
    edited = lambda path: real(path) + (b"# edited" if path.name == "rule.py" else b"")  # noqa: E731
    try:
        with mock.patch.object(Path, "read_bytes", edited):
            assert trace_cache.fingerprint() != first
    finally:
        trace_cache.fingerprint.cache_clear()
    assert trace_cache.fingerprint() == first
