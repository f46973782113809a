"""`python -m etfuse.backend_ops`: the catalog as docs/ops.md's op table (Markdown), derived from
the `BackendOp` records; `python -m etfuse.docs` writes it into that page, and tests/test_docs.py
and tests/test_backend_ops.py check the page holds exactly this table."""

from . import CATALOG, runtime_op


def op_table() -> str:
    rows = ["| backend op | kernel file (`kernels/csrc/ops/`) | a `.pte` calls | Triton | what it computes |",
            "|---|---|---|---|---|"]
    for op in CATALOG:
        kernel = f"`{op.kernel}.cpp`" if op.kernel else "reference only"
        called = runtime_op(op)
        emitted = f"`{called.namespace}::{called.out_name}`" if op.kernel else ""
        rows.append(f"| `{op.qualname}` | {kernel} | {emitted} | {'yes' if op.triton else ''} | {op.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(op_table())
