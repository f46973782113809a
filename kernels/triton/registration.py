"""CUDA registrations of the Triton kernels (imported by `etfuse.kernels.triton.register()`).

Where the kernels go, and why:

* **`.out` variants, CUDA key.** The counterpart of the C++ kernels' CPU registration:
  `torch.ops.etfuse.add_relu.out(a, b, out=o)` on CUDA tensors runs the Triton kernel.
* **Functional ops, CUDA key** (`etfuse::add_relu`, `linear_relu`, `addmm_relu`,
  `quantized_decomposed::add`, `add_relu`, `embedding_byte`). A CUDA-key kernel leaves the
  op's CompositeImplicitAutograd pattern in place for every other device, so CPU programs
  export, fake-trace and `run_decompositions()` exactly as before (tested), and torch's export
  decomposition (`_op_dk(CompositeImplicitAutograd)`) still finds the pattern for CUDA
  programs. (A CPU-key kernel is different: the C++ kernels stay on the `.out` variants.)
* **Functional ops, AutogradCUDA key.** A backend kernel takes the CompositeImplicitAutograd
  kernel away from the matching autograd key, which would leave CUDA calls with no
  derivative. The AutogradCUDA kernel runs the pattern (differentiable aten ops) when an
  input requires grad under grad mode, and the Triton kernel below autograd otherwise.

What this costs (measured, tests/test_triton.py): an exported program whose example inputs are
CUDA tensors keeps the fused op through `run_decompositions()` (export overrides the autograd
keys and, with a CUDA kernel present, never reaches the pattern there); export it with CPU (or
meta) example inputs to get the pattern back. CPU programs are unaffected. torch.compile's
AOTAutograd decomposes CompositeImplicitAutograd ops itself, so compiled code runs inductor's
fusion of the pattern, not these kernels; eager CUDA calls run these kernels.

Every kernel falls back to the op's pattern for the cases the Triton kernel does not cover
(`launch.Unsupported`), so a registered op never refuses a call its pattern accepts.
"""

from __future__ import annotations

import torch
from torch.library import Library


from etfuse.backend_ops import SHARED_NAMESPACES

from . import launch

# Libraries must stay alive: a collected Library takes its registrations with it.
_LIBRARIES: dict[str, Library] = {}
REGISTERED: list[str] = []


def _lib(namespace: str) -> Library:
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = Library(namespace, "IMPL")
    return _LIBRARIES[namespace]


def _requires_grad(args) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _functional(op, launcher):
    """CUDA kernel of a functional op: the Triton launcher, else the op's pattern."""
    def kernel(*args):
        try:
            return launcher(*args)
        except launch.Unsupported:
            return op.pattern(*args)
    kernel.__name__ = f"{op.name.replace('.', '_')}_cuda"
    return kernel


def _autograd(op):
    def kernel(*args):
        if _requires_grad(args):
            return op.pattern(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.aten(*args)
    kernel.__name__ = f"{op.name.replace('.', '_')}_autograd_cuda"
    return kernel


def _out(op, launcher):
    """CUDA kernel of an out variant: the Triton launcher writing into `out`, else the
    pattern copied into `out` (the reference kernel's behaviour)."""
    def kernel(*args, out):
        try:
            return launcher(*args, out=out)
        except launch.Unsupported:
            result = op.pattern(*args)
            out.resize_(result.shape)
            return out.copy_(result)
    kernel.__name__ = f"{op.out_name.replace('.', '_')}_cuda"
    return kernel


def kernels() -> list:
    """(backend op, Triton launcher) for every catalog record with a `triton` launcher name
    (positional args = the op's schema arguments; `out=` keyword)."""
    from etfuse.backend_ops import CATALOG

    return [(op, getattr(launch, op.triton)) for op in CATALOG if op.triton]


KERNELS = kernels()


def _impl(lib: Library, qualname: str, name: str, fn, key: str) -> None:
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key):
        # ours from an earlier import (importlib.reload) or someone else's: keep it
        return
    lib.impl(name, fn, key)
    REGISTERED.append(f"{qualname} [{key}]")


def register_all() -> list[str]:
    for op, launcher in KERNELS:
        lib = _lib(op.namespace)
        out_qualname = f"{op.namespace}::{op.out_name}"
        _impl(lib, op.qualname, op.name, _functional(op, launcher), "CUDA")
        _impl(lib, op.qualname, op.name, _autograd(op), "AutogradCUDA")
        if op.namespace not in SHARED_NAMESPACES:  # their `.out` is executorch's; the twin's is ours
            _impl(lib, out_qualname, op.out_name, _out(op, launcher), "CUDA")
    return list(REGISTERED)
