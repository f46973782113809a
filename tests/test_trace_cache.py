"""The on-disk cache of traced patterns (patterns/trace_cache.py): a new process reads its rule
table's edge graphs instead of exporting them again; what it cannot use it traces.
(That every rule of the table round-trips is checked in test_rules.py, beside the full trace.)"""

import os
import tempfile
from pathlib import Path
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from etfuse.backend_ops import BackendOp, install
from etfuse.patterns import RULES, Rule, rule as rule_module, trace_cache


def _sample():
    """A pattern with a BackendOp replacement, a QuantRule (dtype parameters), a function replacement."""
    # conv1d: a function replacement that no rule-level cache of its own holds (EmbeddingRule's does)
    with_function = next(r for r in RULES if not isinstance(r.replacement, BackendOp) and r.name.startswith("conv1d"))
    quant = next(r for r in RULES if getattr(r, "dtypes", None))
    return [RULES[-1], quant, with_function]


class TraceCacheTest(TestCase):
    def setUp(self):
        install()
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        for patch in (mock.patch.dict(os.environ, {"ETFUSE_PATTERN_CACHE": self.dir.name}),
                      mock.patch.object(trace_cache, "_LOADED", {}),
                      mock.patch.object(rule_module, "_TRACED", {}),
                      mock.patch.object(rule_module, "_TRACED_REPLACEMENTS", {})):
            patch.start()
            self.addCleanup(patch.stop)

    def _new_process(self):
        trace_cache._LOADED.clear()
        rule_module._TRACED.clear()
        rule_module._TRACED_REPLACEMENTS.clear()

    def test_a_warm_cache_needs_no_export(self):
        rules = _sample()
        traced = [str(p.graph) for p in rule_module.edge_patterns(rules)]
        replacement = str(rules[2].replacement_graph().graph)
        self.assertEqual(sorted(f.split(".")[1] for f in os.listdir(self.dir.name)), ["patterns", "replacements"])
        self._new_process()
        with mock.patch.object(rule_module, "_to_edge", side_effect=AssertionError("exported")):
            self.assertEqual([str(p.graph) for p in rule_module.edge_patterns(rules)], traced)
            self.assertEqual(str(rules[2].replacement_graph().graph), replacement)

    def test_a_damaged_file_is_traced_again_and_replaced(self):
        rule = RULES[-1]
        expected = str(rule.edge_pattern().graph)
        (path,) = [os.path.join(self.dir.name, f) for f in os.listdir(self.dir.name)]
        with open(path, "wb") as f:
            f.write(b"\x80\x04not a pickle")
        self._new_process()
        self.assertEqual(str(rule.edge_pattern().graph), expected)
        self._new_process()
        with mock.patch.object(rule_module, "_to_edge", side_effect=AssertionError("exported")):
            self.assertEqual(str(rule.edge_pattern().graph), expected)

    def test_a_users_rule_is_not_stored(self):
        def pattern(x, y):
            return torch.ops.aten.relu.default(torch.ops.aten.sub.Tensor(x, y))

        def replacement(x, y):
            return torch.ops.aten.relu.default(torch.ops.aten.sub.Tensor(x, y))

        mine = Rule("sub_relu", pattern, replacement, lambda: (torch.randn(4), torch.randn(4)))
        self.assertIsNone(trace_cache.rule_id(mine, False))
        mine.edge_pattern()
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_off_writes_nothing(self):
        with mock.patch.dict(os.environ, {"ETFUSE_PATTERN_CACHE": "off"}):
            RULES[-1].edge_pattern()
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_the_key_changes_with_the_source(self):
        first = trace_cache.fingerprint()
        trace_cache.fingerprint.cache_clear()
        self.addCleanup(trace_cache.fingerprint.cache_clear)
        real = Path.read_bytes
        edited = lambda path: real(path) + (b"# edited" if path.name == "rule.py" else b"")  # noqa: E731
        with mock.patch.object(Path, "read_bytes", edited):
            self.assertNotEqual(trace_cache.fingerprint(), first)
        trace_cache.fingerprint.cache_clear()
        self.assertEqual(trace_cache.fingerprint(), first)


if __name__ == "__main__":
    run_tests()
