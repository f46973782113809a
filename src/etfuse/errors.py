"""The base of every error etfuse raises on purpose.

`except etfuse.EtfuseError` catches them all; each keeps its own class (`LoopLoweringError`,
`FusionError`, ...) and a builtin base (`RuntimeError`, `ValueError`) for older `except` clauses.
This module imports nothing, so every layer (catalog, rules, passes, kernels) can use it.
"""


class EtfuseError(Exception):
    """An error etfuse raised on purpose: the message names the op, pattern, pass or node."""


class CliError(EtfuseError, ValueError):
    """A problem with the input to the `etfuse` command (a path, a --shape): printed as one line,
    exit code 2."""
