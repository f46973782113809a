"""`python -m etfuse.backend_ops`: the catalog as the README's op table (Markdown), derived from
the `BackendOp` records; tests/test_backend_ops.py checks the README holds exactly this table."""

from . import CATALOG


def op_table() -> str:
    rows = ["| backend op | kernel file (`kernels/csrc/ops/`) | runtime library | Triton | what it computes |",
            "|---|---|---|---|---|"]
    for op in CATALOG:
        kernel = f"`{op.kernel}.cpp`" if op.kernel else "reference only"
        library = f"`libetfuse_{op.runtime_library}.so`" if op.kernel else ""
        rows.append(f"| `{op.qualname}` | {kernel} | {library} | {'yes' if op.triton else ''} | {op.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(op_table())
