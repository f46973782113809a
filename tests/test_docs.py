"""docs/: the generated pages are what the code gives today (`python -m etfuse.docs --check`), and
every Python block of docs/*.md runs verbatim, each in a fresh process, as a user would paste it
(as tests/test_readme.py does for README.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCKS = [(page.name, i, block)
          for page in sorted(DOCS.glob("*.md"))
          for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M))]


def test_generated_docs_are_current():
    out = subprocess.run([sys.executable, "-m", "etfuse.docs", "--check", "--dir", str(DOCS)],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, (f"stale generated docs: run `python -m etfuse.docs`\n{out.stdout}"
                                 f"\n--- stderr ---\n{out.stderr[-4000:]}")


def test_generated_docs_are_deterministic():
    """What the generator writes depends on the code only: no addresses, paths or timings."""
    text = "".join((DOCS / name).read_text() for name in ("ops.md", "passes.md", "rules.md"))
    assert not re.search(r" at 0x[0-9a-f]+|site-packages", text)
    assert str(DOCS.parent) not in text


def test_docs_have_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("page, index, block", BLOCKS, ids=[f"{page}-{i}" for page, i, _ in BLOCKS])
def test_docs_python_block_runs_verbatim(page, index, block, tmp_path):
    script = tmp_path / f"{Path(page).stem}_block_{index}.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{page} block {index} failed:\n{block}\n--- stderr ---\n{out.stderr[-4000:]}"
    assert out.stderr == "", f"{page} block {index} wrote to stderr:\n{out.stderr[-4000:]}"  # quiet (etfuse.quiet)
