"""Every Python block in README.md runs verbatim, each in a fresh process, as a user would paste it
(docs/*.md's blocks: tests/test_docs.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2  # "Use" and "Adding a fusion"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs_verbatim(index, tmp_path):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(BLOCKS[index])
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"README block {index} failed:\n{BLOCKS[index]}\n--- stderr ---\n{out.stderr[-4000:]}"
    # quiet: no foreign warnings or log lines (etfuse.quiet), and etfuse itself has nothing to say
    assert out.stderr == "", f"README block {index} wrote to stderr:\n{out.stderr[-4000:]}"
