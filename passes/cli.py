"""The `etfuse` command: `etfuse demo`, `etfuse fuse MODEL.pt2 -o MODEL.pte [--report R.md]`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
import zipfile
from typing import Optional, Sequence

import torch


class CliError(Exception):
    """A problem with the user's input: printed as one line, exit code 2."""


class DemoModel(torch.nn.Module):
    """linear+relu, a residual add+relu, and a torch.cond whose branch fuses too."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h) + x)

        def grow(h, x):
            return torch.relu(h + x)

        def shrink(h, x):
            return h - x

        return torch.cond(h.mean() > 0, grow, shrink, (h, x))


def _print_result(result, title: str, out=None) -> None:
    out = out or sys.stdout
    print(f"== {title}", file=out)
    print("ops before -> after (bodies of control flow included):", file=out)
    for op in sorted(set(result.ops_before) | set(result.ops_after)):
        print(f"  {op:45s} {result.ops_before.get(op, 0):4d} -> {result.ops_after.get(op, 0):4d}", file=out)
    print("fused:", file=out)
    for f in result.fused:
        print(f"  {f.rule:20s} in {f.graph or 'forward':14s} {' + '.join(f.replaced)} -> {f.node}", file=out)
    for d in result.declined:
        print(f"  not fused: {d.rule} at {d.node} ({d.graph or 'forward'}): {d.reason}", file=out)
    print(f"max abs error, ExecuTorch runtime vs eager: {result.max_abs_error:.3g}", file=out)
    speedup = result.latency_unfused_ms / max(result.latency_fused_ms, 1e-9)
    print(f"runtime latency: stock {result.latency_unfused_ms:.3f} ms, fused {result.latency_fused_ms:.3f} ms "
          f"({speedup:.2f}x)", file=out)


def demo(args) -> int:
    from .lowering import lower_and_compare

    torch.manual_seed(0)
    model = DemoModel().eval()
    inputs = (torch.randn(32, 256),)
    exported = torch.export.export(model, inputs)
    result = lower_and_compare(exported, inputs)
    _print_result(result, "etfuse demo: linear+relu, residual add+relu, torch.cond")
    if result.max_abs_error > 1e-4:
        print(f"error: the fused program differs from eager by {result.max_abs_error}", file=sys.stderr)
        return 1
    return 0


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(",") if d)
    except ValueError:
        raise CliError(f"--shape {text!r}: expected sizes like 1,3,224,224") from None
    if not shape or any(d <= 0 for d in shape):
        raise CliError(f"--shape {text!r}: sizes must be positive")
    return shape


def _load_exported(path: str) -> torch.export.ExportedProgram:
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise CliError(f"{path}: not a torch.export.save file (.pt2)")
    try:
        ep = torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise CliError(f"{path}: cannot be loaded as an ExportedProgram: {str(e).splitlines()[0]}") from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise CliError(f"{path}: holds a {type(ep).__name__}, not an ExportedProgram")
    return ep


def _example_inputs(ep: torch.export.ExportedProgram, shapes: Optional[list[str]]) -> tuple:
    if shapes:
        return tuple(torch.randn(_parse_shape(s)) for s in shapes)
    saved = getattr(ep, "example_inputs", None)
    if saved is None:
        raise CliError("the program was saved without example inputs: give one --shape per input")
    args, kwargs = saved
    if kwargs:
        raise CliError("programs with keyword inputs are not supported: give one --shape per positional input")
    return tuple(args)


def fuse_file(args) -> int:
    from .lowering import lower_and_compare

    ep = _load_exported(args.model)
    inputs = _example_inputs(ep, args.shape)
    try:
        result = lower_and_compare(ep, inputs)
    except Exception as e:  # noqa: BLE001 - lowering failures are the user's model, said in one line
        raise CliError(f"{args.model}: cannot be lowered and fused: {type(e).__name__}: {str(e).strip().splitlines()[0]}") from None
    with open(args.output, "wb") as f:
        f.write(result.pte)
    _print_result(result, f"etfuse fuse {args.model} -> {args.output}")
    if args.report:
        with open(args.report, "w") as f:
            f.write(result.markdown(f"etfuse report: {os.path.basename(args.model)}"))
        print(f"report written to {args.report}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="etfuse", description="Fuse ExecuTorch edge-dialect programs into backend ops.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="export, fuse, lower and run a built-in model; compare with eager")
    f = sub.add_parser("fuse", help="fuse a torch.export.save file into a .pte")
    f.add_argument("model", help="a .pt2 file written by torch.export.save")
    f.add_argument("-o", "--output", required=True, help="the .pte to write")
    f.add_argument("--report", help="write a Markdown report here")
    f.add_argument("--shape", action="append", help="example input shape, e.g. 1,3,224,224 (one per input; float32)")
    args = parser.parse_args(argv)
    # The command speaks in one-line messages; torch/executorch deprecation chatter is not for its users.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return demo(args) if args.command == "demo" else fuse_file(args)
        except CliError as e:
            print(f"etfuse: error: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
