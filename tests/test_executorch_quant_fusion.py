"""executorch's own tests for its QuantFusionPass, run against etfuse's drop-in.

The file ships in the executorch wheel (`executorch/exir/tests/test_quant_fusion_pass.py`). It
is loaded unchanged except for one line, its import of executorch's pass module, which is
switched to `etfuse.passes.quant_fusion`. Op names are compared across the dialect prefix: etfuse
puts fused ops in the backend dialect (`executorch_exir_dialects_backend__ops_...`) where
executorch's pass leaves them in the edge dialect (`..._edge__ops_...`), same op names; and once
lowered, etfuse's fused ops call etfuse's kernels by their twins' names
(`torch.ops.etfuse.quantized_decomposed_add.out` for `torch.ops.quantized_decomposed.add.out`,
backend_ops/runtime_names.py), read here as the names they stand for.
"""

import os
import re
import types

import executorch.exir
from torch.testing import FileCheck as TorchFileCheck

_FILE = os.path.join(os.path.dirname(executorch.exir.__file__), "tests", "test_quant_fusion_pass.py")
_IMPORT = re.compile(r"from executorch\.exir\.passes\.quant_fusion_pass import \(([^)]*)\)")


class DialectBlindFileCheck:
    """torch's FileCheck, reading backend-dialect op names as their edge-dialect spelling."""

    def __init__(self):
        self._check = TorchFileCheck()

    def __getattr__(self, name):
        method = getattr(self._check, name)
        if name == "run":
            return lambda code: method(code.replace("_dialects_backend__ops_", "_dialects_edge__ops_")
                                       .replace("torch.ops.etfuse.quantized_decomposed_", "torch.ops.quantized_decomposed."))

        def chained(*args, **kwargs):
            method(*args, **kwargs)
            return self

        return chained


def _load() -> types.ModuleType:
    with open(_FILE) as f:
        source = f.read()
    imported = _IMPORT.search(source)
    assert imported, f"{_FILE} no longer imports executorch's quant_fusion_pass the way this test expects"
    names = {n.strip() for n in imported.group(1).split(",") if n.strip()}
    assert names == {"_get_node_value_dict", "quant_fusion_and_const_prop_pass", "QuantFusionPass"}, names
    source = source.replace(imported.group(0), f"from etfuse.passes.quant_fusion import ({imported.group(1)})")
    module = types.ModuleType("executorch_test_quant_fusion_pass_with_etfuse")
    module.__file__ = _FILE
    exec(compile(source, _FILE, "exec"), module.__dict__)
    module.FileCheck = DialectBlindFileCheck
    return module


_MODULE = _load()


class TestExecutorchQuantFusionPassWithEtfuse(_MODULE.TestQuantFusionPass):
    def test_the_pass_under_test_is_etfuse(self):
        from etfuse.passes.quant_fusion import QuantFusionPass

        self.assertIs(_MODULE.QuantFusionPass, QuantFusionPass)
