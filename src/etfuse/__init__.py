"""etfuse: fuse chains of ExecuTorch edge-dialect ops into backend ops.

    edge = etfuse.to_edge(torch.export.export(model, args))   # executorch's to_edge, control-flow safe
    fused = etfuse.fuse(edge)                 # or edge.transform(etfuse.passes.default_passes())
    etfuse.kernels.load()                     # C++ kernels for torch eager and the runtime
    pte = fused.to_executorch().buffer

    etfuse.profile(pte, inputs)               # time per op on the runtime (ETDump): an OpProfile
    etfuse.report.collect(model, inputs)      # what fused, what did not and why, where time goes

`import etfuse` is cheap: `etfuse.passes`, `etfuse.kernels`, `etfuse.runtime`, `etfuse.backend_ops`,
`etfuse.patterns`, `etfuse.profiling`, `etfuse.compare` and `etfuse.report` import (executorch with them) the first
time they are used.
"""

import importlib

from .errors import EtfuseError
from .quiet import install_log_filters

install_log_filters()  # before anything imports executorch (and with it torchao)

__version__ = "0.1.0"

_SUBMODULES = ("backend_ops", "patterns", "passes", "kernels", "runtime", "errors", "profiling", "report", "compare")
__all__ = ["fuse", "to_edge", "profile", "EtfuseError", *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fuse(program, passes=None):
    """See `etfuse.passes.fuse`."""
    from etfuse.passes import fuse as _fuse

    return _fuse(program, passes)


def to_edge(program, compile_config=None, **kwargs):
    """`executorch.exir.to_edge` that keeps `map` dynamic, lowers SymInt builtins exactly and
    refuses to silently specialise a dynamic dimension. See `etfuse.passes.pipeline.to_edge`."""
    from etfuse.passes import to_edge as _to_edge

    return _to_edge(program, compile_config=compile_config, **kwargs)


def profile(program, inputs, runs=10, warmup=1, method="forward", label=""):
    """Time per operator of a .pte (bytes, path, or a program) on the ExecuTorch runtime, from
    ETDump: an `etfuse.profiling.OpProfile`. See `etfuse.profiling.profile`."""
    from etfuse.profiling import profile as _profile

    return _profile(program, inputs, runs=runs, warmup=warmup, method=method, label=label)
