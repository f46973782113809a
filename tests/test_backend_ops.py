"""The op catalog: registration coexists with executorch's, conflicts are named, ops pass opcheck."""

import subprocess
import sys
import textwrap

import pytest
import torch

from etfuse.backend_ops import FLOAT_OPS, BackendOp, BackendOpError, register

SAMPLE_ARGS = {
    "add_relu": [(torch.randn(3, 4), torch.randn(3, 4)), (torch.randn(2, 3, 4), torch.randn(4))],
    "linear_relu": [(torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)), (torch.randn(3, 8), torch.randn(5, 8))],
    "addmm_relu": [(torch.randn(5), torch.randn(3, 7), torch.randn(7, 5))],
    "mul": [(torch.randn(2, 8, 5, 5), torch.randn(2, 8, 1, 1)), (torch.randn(1, 8, 1, 1), torch.randn(3, 8, 4, 6)),
            (torch.randn(3, 4), torch.randn(3, 4))],
    "add": [(torch.randn(2, 5, 8), torch.randn(8)), (torch.randn(8), torch.randn(3, 8)), (torch.randn(3, 4), torch.randn(3, 4))],
}


@pytest.mark.parametrize("op", FLOAT_OPS, ids=lambda op: op.name)
def test_functional_op_passes_opcheck(op):
    for args in SAMPLE_ARGS[op.name]:
        torch.library.opcheck(op.aten, args)


@pytest.mark.parametrize("op", FLOAT_OPS, ids=lambda op: op.name)
def test_functional_op_is_its_pattern(op):
    for args in SAMPLE_ARGS[op.name]:
        torch.testing.assert_close(op.aten(*args), op.pattern(*args))


def test_out_schema_is_derived():
    assert [op.out_schema for op in FLOAT_OPS] == [
        "add_relu.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
        "linear_relu.out(Tensor input, Tensor weight, Tensor? bias=None, *, Tensor(a!) out) -> Tensor(a!)",
        "addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)",
        "mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
        "add.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
    ]


def _double_relu(x):
    return torch.relu(x) * 2


# Module-level: a Library that is garbage-collected takes its ops with it, and executorch keeps
# listing the namespace as a backend-op namespace, which breaks later lowering in this process.
_OTHER_LIB = torch.library.Library("etfuse_catalog_test", "DEF")


def test_identical_schema_is_reused_and_conflicting_one_is_named():
    lib = _OTHER_LIB
    lib.define("double_relu(Tensor x) -> Tensor")  # someone else defined it first, identically
    op = register(BackendOp("etfuse_catalog_test", "double_relu(Tensor x) -> Tensor", _double_relu))
    torch.testing.assert_close(op.aten(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 4.0]))

    lib.define("clash(Tensor x, int n) -> Tensor")
    with pytest.raises(BackendOpError) as e:
        register(BackendOp("etfuse_catalog_test", "clash(Tensor x) -> Tensor", _double_relu))
    message = str(e.value)
    assert "etfuse_catalog_test::clash" in message
    assert "existing: etfuse_catalog_test::clash(Tensor x, int n) -> Tensor" in message
    assert "etfuse:   etfuse_catalog_test::clash(Tensor x) -> Tensor" in message


def test_pattern_must_take_the_schema_arguments():
    with pytest.raises(BackendOpError, match=r"pattern parameters \['y'\] must be the schema's arguments \['x'\]"):
        register(BackendOp("etfuse_catalog_test", "wrong_names(Tensor x) -> Tensor", lambda y: y))


@pytest.mark.parametrize("first", ["executorch", "etfuse"])
def test_import_order_with_executorch(first):
    """etfuse and executorch register into the same namespaces; either may be imported first."""
    imports = {
        "executorch": "import executorch.exir, executorch.exir.passes.quant_fusion_pass",
        "etfuse": "import etfuse.backend_ops, etfuse.passes",
    }
    second = "etfuse" if first == "executorch" else "executorch"
    code = textwrap.dedent(f"""
        {imports[first]}
        {imports[second]}
        import torch
        from etfuse.backend_ops import registered_ops, runtime_op
        for op in registered_ops():
            op.aten, runtime_op(op).aten_out, op.backend
        print(len(registered_ops()), torch.ops.etfuse.add_relu(torch.tensor([-1.0]), torch.tensor([3.0])).item())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    count, value = result.stdout.split()[-2:]
    assert int(count) >= 3 and float(value) == 2.0


def test_importing_the_catalog_changes_nothing_until_install():
    """`import etfuse.backend_ops` (and the rules and passes above it) registers etfuse's own ops
    only and loads no runtime; `install()` replaces executorch's prim and quantized kernels and
    guards the stock quantized module, once."""
    code = textwrap.dedent("""
        import json, sys, torch
        import executorch.exir
        names = ["executorch_prim::sym_max.Scalar", "executorch_prim::sym_ite.Scalar", "quantized_decomposed::add",
                 "quantized_decomposed::embedding_byte", "quantized_decomposed::embedding_byte.out"]
        def state():
            return {n: torch._C._dispatch_dump(n) for n in names}
        def ours(dumps):
            return {n: "backend_ops" in d for n, d in dumps.items()}
        stock = state()
        import etfuse.backend_ops, etfuse.patterns, etfuse.passes
        imported = state()
        out = {"import_same": imported == stock, "import_ours": ours(imported),
               "import_loads_stock": "executorch.kernels.quantized" in sys.modules,
               "runtime_loaded": [m for m in ("etfuse.runtime", "etfuse.kernels", "etfuse.compare") if m in sys.modules]}
        etfuse.backend_ops.install()
        installed = state()
        out["install_ours"] = ours(installed)
        out["install_loads_stock"] = hasattr(sys.modules.get("executorch.kernels.quantized"), "__file__")
        etfuse.backend_ops.install()
        out["twice_same"] = state() == installed
        print(json.dumps(out))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    out = json.loads(result.stdout.strip().splitlines()[-1])
    names = ["executorch_prim::sym_max.Scalar", "executorch_prim::sym_ite.Scalar", "quantized_decomposed::add",
             "quantized_decomposed::embedding_byte", "quantized_decomposed::embedding_byte.out"]
    assert out["import_same"] and out["import_ours"] == dict.fromkeys(names, False) and not out["import_loads_stock"]
    assert out["runtime_loaded"] == []
    # install() imports executorch's real stock quantized library (it shares no name with etfuse's)
    assert out["install_ours"] == dict.fromkeys(names, True) and out["install_loads_stock"]
    assert out["twice_same"]


def test_docs_op_table_is_the_catalog():
    """docs/ops.md's op table is derived from the records (`python -m etfuse.backend_ops` prints it,
    `python -m etfuse.docs` writes the page; tests/test_docs.py checks the whole page)."""
    from pathlib import Path

    from etfuse.backend_ops.__main__ import op_table

    ops_page = (Path(__file__).resolve().parent.parent / "docs" / "ops.md").read_text()
    assert op_table() in ops_page, "docs/ops.md's op table is stale: run `python -m etfuse.docs`"
