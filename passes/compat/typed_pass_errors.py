"""executorch 1.5.1 wraps every error a pass raises in a bare `Exception`.

`ExportedProgramPassManager.__call__` (what `EdgeProgramManager.transform` runs) catches any
exception from a pass and raises `Exception("An error occurred when running the 'X' pass after
the following passes: [...]") from e`, so `except LoopLoweringError` never matches an error from
`edge.transform(etfuse.passes.default_passes())`.

`install_typed_pass_errors()` wraps that method once (idempotent; `default_passes()` calls it):
when the wrapped error is an `EtfuseError`, the `EtfuseError` itself is raised, with executorch's
message kept as its `__cause__`. Every other error, from any pass, passes through as executorch
raised it. Delete this module when executorch re-raises pass errors unwrapped.
"""

from __future__ import annotations

import functools
import threading

from executorch.exir.pass_manager import ExportedProgramPassManager

from etfuse.errors import EtfuseError

_LOCK = threading.Lock()
_MARK = "_etfuse_typed_errors"


def etfuse_error_in(error: BaseException):
    """The first `EtfuseError` in `error`'s chain of causes, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, EtfuseError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def install_typed_pass_errors() -> None:
    with _LOCK:
        call = ExportedProgramPassManager.__call__
        if getattr(call, _MARK, False):
            return

        @functools.wraps(call)
        def __call__(self, *args, **kwargs):
            try:
                return call(self, *args, **kwargs)
            except EtfuseError:
                raise
            except Exception as wrapper:
                typed = etfuse_error_in(wrapper.__cause__)
                if typed is None:
                    raise
                context = Exception(str(wrapper))  # executorch's pass-order message, without the cycle
                raise typed.with_traceback(typed.__traceback__) from context

        setattr(__call__, _MARK, True)
        ExportedProgramPassManager.__call__ = __call__
