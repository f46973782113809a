"""etfuse: fuse chains of ExecuTorch edge-dialect ops into backend ops."""

__version__ = "0.1.0"
