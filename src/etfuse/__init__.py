"""etfuse: fuse chains of ExecuTorch edge-dialect ops into backend ops.

    edge = executorch.exir.to_edge(torch.export.export(model, args))
    fused = etfuse.fuse(edge)                 # or edge.transform(etfuse.passes.default_passes())
    etfuse.kernels.load()                     # C++ kernels for torch eager and the runtime
    pte = fused.to_executorch().buffer
"""

__version__ = "0.1.0"


def fuse(program, passes=None):
    """See `etfuse.passes.fuse`."""
    from etfuse.passes import fuse as _fuse

    return _fuse(program, passes)
