"""Float backend ops: an activation fused into the op that produces its input."""

import torch

from .registry import BackendOp, register

aten = torch.ops.aten


def _add_relu(self, other):
    return aten.relu.default(aten.add.Tensor(self, other))


def _mul(self, other):
    return aten.mul.Tensor(self, other)


def _add(self, other):
    return aten.add.Tensor(self, other)


def _linear_relu(input, weight, bias=None):
    return aten.relu.default(aten.linear.default(input, weight, bias))


def _addmm_relu(self, mat1, mat2):
    return aten.relu.default(aten.addmm.default(self, mat1, mat2))


ADD_RELU = register(BackendOp(
    "etfuse", "add_relu(Tensor self, Tensor other) -> Tensor", _add_relu,
    doc="relu(self + other), broadcasting like aten.add", kernel="add_relu", triton="add_relu"))
LINEAR_RELU = register(BackendOp(
    "etfuse", "linear_relu(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", _linear_relu,
    doc="relu(input @ weight.T + bias), weight read as stored ([out, in])", kernel="linear_relu", triton="linear_relu"))
ADDMM_RELU = register(BackendOp(
    "etfuse", "addmm_relu(Tensor self, Tensor mat1, Tensor mat2) -> Tensor", _addmm_relu,
    doc="relu(self + mat1 @ mat2), self broadcast to [M, N]", kernel="addmm_relu", triton="addmm_relu"))

MUL = register(BackendOp(
    "etfuse", "mul(Tensor self, Tensor other) -> Tensor", _mul,
    doc="self * other, broadcasting like aten.mul (the rules use it for a squeeze-excite's per-channel scale and "
        "a per-feature scale along the last dim, where the portable kernel's broadcast is slow)", kernel="mul"))
ADD = register(BackendOp(
    "etfuse", "add(Tensor self, Tensor other) -> Tensor", _add,
    doc="self + other, broadcasting like aten.add (the rules use it for a per-feature shift along the last dim, "
        "MobileBERT's NoNorm, where the portable kernel's broadcast is slow)", kernel="add"))
FLOAT_OPS = [ADD_RELU, LINEAR_RELU, ADDMM_RELU, MUL, ADD]
