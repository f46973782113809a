"""Foreign log lines etfuse keeps off its users' stderr, each named precisely, nothing else.

Importing executorch.exir imports torchao, which logs a warning for each of its CUDA-only
extensions that cannot load on a CPU machine and, through torch's pytree, a deprecation of its
own enum registration; torch's `copy.deepcopy` of a tree spec (in `run_decompositions`, which
executorch's `to_edge` calls, and in etfuse's copies of programs) warns that its own
`isinstance(treespec, LeafSpec)` is deprecated; and the ExecuTorch runtime's threadpool prints
what it could not read of the CPU's identity when it starts. None of it is actionable for someone fusing a model, and it
came before etfuse's own output. Anything else those libraries log still gets through.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from typing import Callable, TypeVar

T = TypeVar("T")

# (logger, start of the messages dropped, what they must also contain)
_DROPPED = (
    ("torchao", "Failed to load ", "/torchao/_C"),  # only its compiled extensions, not any failure it reports
    ("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass", ""),
)
# torch's deprecation of its own internal check, raised inside its deepcopy of a tree spec
_TREESPEC_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
# The runtime threadpool's start-up lines (executorch's cpuinfo_utils.cpp, printed by ET_LOG).
_RUNTIME_START_LINES = "[cpuinfo_utils.cpp:"


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str, contains: str):
        super().__init__()
        self.prefix, self.contains = prefix, contains

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to judge
            return True
        return not (message.startswith(self.prefix) and self.contains in message)


def install_log_filters() -> None:
    """Drop the known foreign messages (idempotent; configures loggers and one warning filter,
    imports nothing)."""
    for name, prefix, contains in _DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropMessages(prefix, contains))
    warnings.filterwarnings("ignore", message=_TREESPEC_DEPRECATION, category=FutureWarning)


def without_runtime_start_lines(fn: Callable[[], T]) -> T:
    """Call `fn` (something that starts the ExecuTorch runtime's threadpool) with the C-level
    stderr captured, and write back every captured line but the threadpool's start-up lines."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr (an embedded interpreter): nothing to hide
        return fn()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            return fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not line.startswith(_RUNTIME_START_LINES.encode())]
            if kept:
                os.write(2, b"".join(kept))
