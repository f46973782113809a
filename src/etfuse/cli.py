"""The `etfuse` command.

    etfuse demo [--bench N] [--bench-seconds S]
    etfuse fuse MODEL.pt2 -o MODEL.pte [--report R.md] [--shape 1,3,32,32 ...] [--compare]
                [--bench N] [--bench-seconds S]
    etfuse build-kernels [--force]
    etfuse ops MODEL.pte [MODEL.pte ...] [--all] [--format lines|cmake]

Everything the command can check about its arguments (paths, shapes against the program's
inputs, memory) is checked before any work, and refused with one line on stderr and exit code 2.
Results are written to a temporary file in the target folder and renamed into place, so a
failure never leaves a partial file and never overwrites an input. Long stages report their
times on stderr when it is a terminal (`--progress` forces it, `--quiet` silences it).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import tempfile
import time
import warnings
import zipfile
from typing import Optional, Sequence

import torch

from .errors import CliError
from .shapes import example_inputs, fix_negative_shapes, human_size, parse_shape


class DemoModel(torch.nn.Module):
    """linear+relu, a linear whose residual add+relu is its epilogue, and a torch.cond whose branch fuses too."""

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


# --- progress --------------------------------------------------------------------------------

class Progress:
    """`with progress("stage"):` prints the stage and its time on stderr, when enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        if self.enabled:
            print(f"etfuse: {stage} ...", file=sys.stderr, flush=True)
        yield
        if self.enabled:
            print(f"etfuse: {stage}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def _progress(args) -> Progress:
    if args.quiet:
        return Progress(False)
    return Progress(args.progress or sys.stderr.isatty())


# --- output ----------------------------------------------------------------------------------

def _fmt_ms(ms: Optional[float]) -> str:
    return "-" if ms is None else f"{ms:.3f} ms"


def _print_summary(result, title: str, detailed: bool, out=None) -> None:
    out = out or sys.stdout
    print(f"== {title}", file=out)
    n_before, n_after = sum(result.ops_before.values()), sum(result.ops_after.values())
    if detailed:
        print("ops before -> after (bodies of control flow included):", file=out)
        for op in sorted(set(result.ops_before) | set(result.ops_after)):
            print(f"  {op:45s} {result.ops_before.get(op, 0):4d} -> {result.ops_after.get(op, 0):4d}", file=out)
        print("fused:", file=out)
        for f in result.fused:
            print(f"  {f.rule:20s} in {f.graph or 'forward':14s} {' + '.join(f.replaced)} -> {f.node}", file=out)
        for d in result.declined:
            print(f"  not fused: {d.rule} at {d.node} ({d.graph or 'forward'}): {d.reason}", file=out)
    else:
        counts: dict[str, int] = {}
        for f in result.fused:
            counts[f.rule] = counts.get(f.rule, 0) + 1
        rules = ", ".join(f"{r} x{n}" for r, n in sorted(counts.items())) or "nothing"
        print(f"ops: {n_before} -> {n_after}; fused: {rules}; not fused: {len(result.declined)}", file=out)
    print(f"max abs error, ExecuTorch runtime vs eager: {result.max_abs_error:.3g}"
          + ("" if result.stock_max_abs_error is None else f" (stock program: {result.stock_max_abs_error:.3g})"),
          file=out)
    if result.latency_fused_ms is not None:
        if result.latency_unfused_ms is not None:
            speedup = result.latency_unfused_ms / max(result.latency_fused_ms, 1e-9)
            print(f"runtime latency: stock {_fmt_ms(result.latency_unfused_ms)}, fused {_fmt_ms(result.latency_fused_ms)} "
                  f"({speedup:.2f}x, median of {result.bench_runs} runs)", file=out)
        else:
            print(f"runtime latency: fused {_fmt_ms(result.latency_fused_ms)} (median of {result.bench_runs} runs)", file=out)


# --- paths -----------------------------------------------------------------------------------

def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_writable(path: str, flag: str) -> None:
    """Refuse an output path that cannot be written, before any work."""
    if path.endswith(os.sep) or os.path.isdir(path):
        raise CliError(f"{flag} {path}: is a folder; name the file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{flag} {path}: folder {folder} does not exist")
    if os.path.exists(path) and not os.path.isfile(path):
        raise CliError(f"{flag} {path}: exists and is not a regular file")
    try:  # os.access says yes to root on read-only mounts and ACL-less checks: try it
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".etfuse-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"{flag} {path}: cannot write in folder {folder}: {e.strerror or e}") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CliError(f"{flag} {path}: the existing file is read-only")


def _check_paths(args) -> None:
    model = args.model
    if not os.path.exists(model):
        raise CliError(f"{model}: no such file")
    if os.path.isdir(model):
        raise CliError(f"{model}: is a folder, not a .pt2 file")
    outputs = [("-o", args.output)] + ([("--report", args.report)] if args.report else [])
    for flag, path in outputs:
        if _same(path, model):
            raise CliError(f"{flag} {path}: is the input model; refusing to overwrite it")
    if getattr(args, "profile", False) and not args.report:
        raise CliError("--profile: needs --report R.md (or R.html) to write the times to")
    if args.report and _same(args.report, args.output):
        raise CliError(f"--report {args.report}: is the same file as -o {args.output}")
    for flag, path in outputs:
        _check_writable(path, flag)


def _write_atomically(path: str, data: bytes) -> str:
    """Write `data` to a temporary file next to `path`; returns the temporary file's name."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _commit(pairs: list[tuple[str, bytes]]) -> None:
    """All files written to temporaries first, then renamed into place (none on failure)."""
    temps: list[tuple[str, str]] = []
    try:
        for path, data in pairs:
            temps.append((_write_atomically(path, data), path))
    except OSError as e:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None
    for tmp, path in temps:
        os.replace(tmp, path)


# --- loading -----------------------------------------------------------------------------------

def _load_exported(path: str) -> torch.export.ExportedProgram:
    if not zipfile.is_zipfile(path):
        raise CliError(f"{path}: not a torch.export.save file (.pt2)")
    # A PT2E-quantized program holds quantized_decomposed ops, which torch.ao defines on import:
    # without them the file does not deserialise.
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    try:
        ep = torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - one line for the user
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CliError(f"{path}: cannot be loaded as an ExportedProgram: {first}") from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise CliError(f"{path}: holds a {type(ep).__name__}, not an ExportedProgram")
    return ep


# --- commands --------------------------------------------------------------------------------

def _import_compare():
    from etfuse.compare import lower_and_compare

    return lower_and_compare


def demo(args) -> int:
    progress = _progress(args)
    torch.manual_seed(0)
    model = DemoModel().eval()
    inputs = (torch.randn(32, 256),)
    with progress("export"):
        exported = torch.export.export(model, inputs)
    with progress("importing executorch"):
        lower_and_compare = _import_compare()
    result = lower_and_compare(exported, inputs, runs=args.bench, compare=True,
                               bench_seconds=args.bench_seconds, progress=progress)
    _print_summary(result, "etfuse demo: linear+relu, linear+residual add+relu, torch.cond", detailed=True)
    if result.max_abs_error > 1e-4:
        print(f"etfuse: error: the fused program differs from eager by {result.max_abs_error}", file=sys.stderr)
        return 1
    return 0


def fuse_file(args) -> int:
    for s in args.shape or []:  # syntax first: nothing to load for a typo
        parse_shape(s)
    _check_paths(args)
    progress = _progress(args)
    with progress(f"loading {args.model}"):
        ep = _load_exported(args.model)
    inputs = example_inputs(ep, args.shape)
    with progress("importing executorch"):
        lower_and_compare = _import_compare()

    try:
        result = lower_and_compare(ep, inputs, runs=args.bench, compare=args.compare or args.profile,
                                   bench_seconds=args.bench_seconds, progress=progress)
    except CliError:
        raise
    except Exception as e:  # noqa: BLE001 - lowering failures are the user's model, said in one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise CliError(f"{args.model}: cannot be lowered and fused: {type(e).__name__}: {first}") from None
    files = [(args.output, result.pte)]
    if args.report:
        with progress("report" + (" (profiling both programs)" if args.profile else "")):
            files += _report_files(args, result, inputs)
    _commit(files)
    _print_summary(result, f"etfuse fuse {args.model} -> {args.output} ({human_size(len(result.pte))})", detailed=False)
    if args.report:
        print(f"report written to {args.report}")
    if result.max_abs_error > 1e-3 and result.max_abs_error != 0:
        print(f"etfuse: warning: the fused program differs from eager by {result.max_abs_error:.3g}", file=sys.stderr)
    return 0


def _report_files(args, result, inputs) -> list[tuple[str, bytes]]:
    """The report (Markdown, or HTML for .html) and its chart, as (final path, bytes): written into
    a scratch folder first, so `_commit` puts them in place together with the .pte, or nothing."""
    import tempfile

    from etfuse.report import write_report

    with tempfile.TemporaryDirectory() as scratch:
        staged = os.path.join(scratch, os.path.basename(args.report))
        files = write_report(staged, result, title=os.path.basename(args.model),
                             inputs=inputs if args.profile else None)
        out = []
        for path in (staged, files.png, files.svg):
            if path:
                with open(path, "rb") as f:
                    out.append((os.path.join(os.path.dirname(args.report), os.path.basename(path)), f.read()))
    return out


def build_kernels(args) -> int:
    import etfuse.kernels

    progress = _progress(args)
    with progress("building the kernels" if args.force else "building or finding the kernels"):
        # both libraries (the eager one too): a prebuilt cache serves every later use
        res = etfuse.kernels.cache.build(force=args.force)
    print(f"etfuse kernels {'built' if res.built else 'found in the cache'}: {res.directory}")
    return 0


_PTE_IDENTIFIER = re.compile(rb"ET\d\d")  # the flatbuffer file identifier at bytes 4..8: ET12, ...


def _program_operators(path: str) -> set[str]:
    """`namespace::name.overload` of every operator in the program's operator tables (all
    methods), read with executorch's .pte reader."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a folder, not a .pte file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CliError(f"{path}: cannot be read: {e.strerror or e}") from None
    if not _PTE_IDENTIFIER.fullmatch(data[4:8]):
        raise CliError(f"{path}: not an ExecuTorch program (.pte)")
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        program = deserialize_pte_binary(data).program
    except Exception as e:  # noqa: BLE001 - a damaged file, said in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CliError(f"{path}: not a readable ExecuTorch program (.pte): {first}") from None
    return {f"{op.name}.{op.overload}" if op.overload else op.name
            for plan in program.execution_plan for op in plan.operators}


def ops(args) -> int:
    names: set[str] = set()
    for path in args.models:
        names |= _program_operators(path)
    if not args.all:
        import etfuse.kernels

        # etfuse's namespace, and the executorch-named ops its kernels register
        ours = set(etfuse.kernels.RUNTIME_OPS)
        names = {n for n in names if n in ours or n.split("::", 1)[0] == "etfuse"}
    if args.format == "cmake":
        print(";".join(sorted(names)))
    else:
        for name in sorted(names):
            print(name)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line: `etfuse: error: ...` and exit code 2."""

    def error(self, message):
        self.exit(2, f"etfuse: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", help="show stage times on stderr even when it is not a terminal")
    p.add_argument("--quiet", action="store_true", help="no stage times on stderr")


def _add_bench(p: argparse.ArgumentParser, runs: int, seconds: float) -> None:
    p.add_argument("--bench", type=_positive_int, default=runs, metavar="N",
                   help=f"time the runtime program(s) over up to N runs (default {runs}; 0: no timing)")
    p.add_argument("--bench-seconds", type=_seconds, default=seconds, metavar="S",
                   help=f"time budget for all timing runs together (default {seconds:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="etfuse", description="Fuse ExecuTorch edge-dialect programs into backend ops.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("demo", help="export, fuse, lower and run a built-in model; compare with eager and the stock ops")
    _add_bench(d, 20, 5.0)
    _add_common(d)
    f = sub.add_parser("fuse", help="fuse a torch.export.save file into a .pte")
    f.add_argument("model", help="a .pt2 file written by torch.export.save")
    f.add_argument("-o", "--output", required=True, help="the .pte to write (never the input)")
    f.add_argument("--report", help="write the fusion report here: Markdown, or one HTML page for .html "
                                    "(a chart of time per op goes next to it with --profile)")
    f.add_argument("--profile", action="store_true",
                   help="time every op of the stock and the fused program (ETDump) for the report")
    f.add_argument("--shape", action="append",
                   help="example input shape, e.g. 1,3,224,224 (one per input, in order; the input's dtype)")
    f.add_argument("--compare", action="store_true",
                   help="also build the stock (unfused) program and check it against eager (and time it with --bench)")
    _add_bench(f, 0, 30.0)
    _add_common(f)
    k = sub.add_parser("build-kernels", help="compile etfuse's C++ kernels now (else on first use) and print the cache folder")
    k.add_argument("--force", action="store_true", help="rebuild even if the cache has them")
    _add_common(k)
    o = sub.add_parser("ops", help="print the etfuse ops .pte programs call (what a selective build of the "
                                   "kernels needs: ETFUSE_SELECT_OPS_MODEL)")
    o.add_argument("models", nargs="+", metavar="MODEL.pte", help="ExecuTorch programs; with several, the union")
    o.add_argument("--all", action="store_true",
                   help="every op the programs call, executorch's too (what EXECUTORCH_SELECT_OPS_LIST takes)")
    o.add_argument("--format", choices=("lines", "cmake"), default="lines",
                   help="one op per line (default), or a CMake ;-list on one line")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(fix_negative_shapes(argv))
    commands = {"demo": demo, "fuse": fuse_file, "build-kernels": build_kernels, "ops": ops}
    # The command speaks in one-line messages; torch/executorch deprecation chatter is not for its users.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return commands[args.command](args)
        except CliError as e:
            print(f"etfuse: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("etfuse: interrupted; nothing written", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
