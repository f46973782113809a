"""A fusion report people read: summary first, time per op before and after, a chart.

    report = etfuse.report.collect(exported_program, inputs)     # fuse, lower, run, check, profile
    files = etfuse.report.write_report("report.md", report)     # or "report.html"
    print(etfuse.report.console_summary(report, files))         # < 30 lines, any model

`collect` runs the whole flow once: `etfuse.to_edge`, `etfuse.fuse` (near misses recorded),
both programs lowered to `.pte`, the fused one checked against eager on the ExecuTorch runtime,
both timed, and both profiled per operator with ETDump (`etfuse.profile`). `write_report`
writes Markdown (`.md`) or one self-contained HTML page (`.html`), and the chart of time by op,
stock vs fused, as `<stem>.png` and `<stem>.svg` next to it (with matplotlib:
`pip install "etfuse[report]"`; without it the report says so). `Report.from_result` takes the
`ComparisonResult` of `etfuse.compare.lower_and_compare` instead.

The report, in order: a summary (fusions per rule, ops before -> after, runtime error, latency,
where the time goes, what to fuse next), then fusions per rule and per control-flow body, ops
before -> after, declined matches grouped by reason (one example node each), near misses (a
rule whose anchor op matched where its pattern did not, and the first point of difference), the
runtime check, time per op for the stock and the fused program with the chart, "what to fuse
next" (ops no etfuse rule covers, ranked by time) and, folded, every fusion.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import functools
import html
import os
from typing import Any, Optional, Sequence

import torch

from .profiling import OpProfile, OpTime, op_base, profile

__all__ = [
    "Report", "ReportFiles", "collect", "write_report", "render_markdown", "render_html", "write_chart",
    "console_summary", "what_to_fuse_next", "rule_ops", "profile", "OpProfile", "OpTime", "CHART_HINT",
]

CHART_HINT = 'pip install "etfuse[report]"'
TOP_OPS = 10  # rows of the time-per-op tables
TOP_CHART = 12  # ops in the chart


@dataclasses.dataclass
class Report:
    """Everything the report says; build with `collect` or `Report.from_result`."""

    title: str
    ops_before: dict[str, int]  # op -> count, all graphs (control-flow bodies included)
    ops_after: dict[str, int]
    fused: list = dataclasses.field(default_factory=list)  # etfuse.passes.Fused
    declined: list = dataclasses.field(default_factory=list)  # etfuse.passes.Declined
    near_misses: list = dataclasses.field(default_factory=list)  # etfuse.passes.NearMiss
    near_misses_recorded: bool = False  # whether the passes were asked to record near misses
    max_abs_error: Optional[float] = None  # ExecuTorch runtime (fused) vs eager
    max_rel_error: Optional[float] = None  # max abs error / max |eager output|
    latency_stock_ms: Optional[float] = None  # median Method::execute, no ETDump
    latency_fused_ms: Optional[float] = None
    stock_profile: Optional[OpProfile] = None
    fused_profile: Optional[OpProfile] = None
    pte: Optional[bytes] = dataclasses.field(default=None, repr=False)  # the fused .pte (write it, profile it)
    stock_pte: Optional[bytes] = dataclasses.field(default=None, repr=False)  # the same program unfused

    @classmethod
    def from_result(cls, result, title: str = "", **fields) -> "Report":
        """From a `ComparisonResult` (or anything with its attributes: ops_before, ops_after,
        fused, declined, max_abs_error, latency_unfused_ms, latency_fused_ms; near_misses and
        max_rel_error if it has them). `fields` set or override any field."""
        if isinstance(result, Report):
            return dataclasses.replace(result, **({"title": title} if title else {}), **fields)
        values = dict(
            title=title,
            ops_before=dict(getattr(result, "ops_before", {})), ops_after=dict(getattr(result, "ops_after", {})),
            fused=list(getattr(result, "fused", [])), declined=list(getattr(result, "declined", [])),
            near_misses=list(getattr(result, "near_misses", None) or []),
            near_misses_recorded=getattr(result, "near_misses", None) is not None,
            max_abs_error=getattr(result, "max_abs_error", None), max_rel_error=getattr(result, "max_rel_error", None),
            latency_stock_ms=getattr(result, "latency_unfused_ms", getattr(result, "latency_stock_ms", None)),
            latency_fused_ms=getattr(result, "latency_fused_ms", None),
            stock_profile=getattr(result, "stock_profile", None), fused_profile=getattr(result, "fused_profile", None),
            pte=getattr(result, "pte", None), stock_pte=getattr(result, "stock_pte", None),
        )
        values.update(fields)
        return cls(**values)

    # -- derived views -------------------------------------------------------------------------

    def fused_per_rule(self) -> dict[str, dict[str, int]]:
        """rule -> graph ("forward" or the body's path) -> count."""
        out: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
        for f in self.fused:
            out[f.rule][f.graph or "forward"] += 1
        return {r: dict(g) for r, g in sorted(out.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))}

    def declined_by_reason(self) -> list[tuple[str, str, int, Any]]:
        """(rule, reason, count, first example) per distinct reason, most frequent first."""
        groups: dict[tuple[str, str], list] = {}
        for d in self.declined:
            groups.setdefault((d.rule, d.reason), []).append(d)
        return sorted(((r, why, len(ds), ds[0]) for (r, why), ds in groups.items()), key=lambda g: (-g[2], g[0], g[1]))

    def relevant_near_misses(self) -> list:
        """Near misses at anchors nothing fused or declined in the end (a later pass may have fused
        what an earlier pass's rule missed)."""
        done = {(f.graph, n) for f in self.fused for n in f.replaced}
        done |= {(d.graph, d.node) for d in self.declined}
        return [m for m in self.near_misses if (m.graph, m.node) not in done]

    def near_misses_grouped(self) -> list[tuple[str, str, str, int, int, int, Any]]:
        """(rule, expected, found, matched, size, count, first example), closest first."""
        groups: dict[tuple, list] = {}
        for m in self.relevant_near_misses():
            groups.setdefault((m.rule, m.expected, m.found, m.matched, m.size), []).append(m)
        rows = [(*k, len(ms), ms[0]) for k, ms in groups.items()]
        return sorted(rows, key=lambda g: (-(g[3] / max(g[4], 1)), -g[5], g[0], g[1], g[2]))

    def fuse_next(self, top: int = 5) -> list[OpTime]:
        prof = self.fused_profile or self.stock_profile
        return what_to_fuse_next(prof, top) if prof is not None else []

    @property
    def speedup(self) -> Optional[float]:
        if self.latency_stock_ms and self.latency_fused_ms:
            return self.latency_stock_ms / max(self.latency_fused_ms, 1e-12)
        return None


@dataclasses.dataclass
class ReportFiles:
    report: str  # the .md or .html written
    png: Optional[str] = None  # the chart, when matplotlib is installed and there is a profile
    svg: Optional[str] = None
    chart_missing: Optional[str] = None  # why there is no chart


# -- which ops have a rule ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def rule_ops() -> frozenset:
    """Base names (`add`, `convolution`, `quantize_per_tensor`, `conv2d_act`, ...) of the ops in
    any etfuse rule's pattern (`etfuse.patterns.RULES`) and
    of the backend ops rules produce (and PrepackWeightsPass's packed forms of them): the ops
    etfuse has a rule for."""
    from etfuse.backend_ops import PREPACKED_OPS, install
    from etfuse.patterns import RULES, edge_patterns

    install()

    names = {_target_base(op.aten) for op in PREPACKED_OPS}
    for rule, pattern in zip(RULES, edge_patterns(RULES)):
        for n in pattern.ops:
            names.add(_target_base(n.target))
        for handle in rule.produces():
            names.add(_target_base(handle))
    return frozenset(names)


def _target_base(target) -> str:
    if not isinstance(target, torch._ops.OpOverload):
        target = getattr(target, "_op", target)  # an edge op's ATen overload
    name = getattr(target, "_schema", None)
    if name is not None:
        return op_base(name.name)
    return op_base(str(getattr(target, "__name__", target)))


def what_to_fuse_next(prof: Optional[OpProfile], top: int = 5) -> list[OpTime]:
    """The ops of `prof` that no etfuse rule covers (`rule_ops`), ranked by time."""
    if prof is None:
        return []
    covered = rule_ops()
    return [r for r in prof.rows if op_base(r.op) not in covered and not r.op.startswith("delegate:")][:top]


# -- collecting ------------------------------------------------------------------------------------

def collect(model, inputs: Sequence[torch.Tensor], *, title: str = "", passes: Optional[list] = None,
            profile_ops: bool = True, runs: int = 10, latency_runs: int = 20) -> Report:
    """Fuse `model` (an `ExportedProgram`, or an `nn.Module` exported here with `inputs`), lower
    the stock and the fused program, check the fused one against eager on the ExecuTorch runtime,
    time both (`latency_runs`), and with `profile_ops` profile both per operator (`runs`).
    The flow is `etfuse.compare.lower_and_compare`'s, with near misses recorded."""
    from etfuse.compare import lower_and_compare

    inputs = tuple(inputs)
    exported = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model, inputs)
    result = lower_and_compare(exported, inputs, passes, runs=latency_runs, compare=True,
                               bench_seconds=float("inf"), near_misses=True)
    report = Report.from_result(result, title=title or type(model).__name__)
    if profile_ops:
        report.stock_profile = profile(report.stock_pte, inputs, runs=runs, label="stock")
        report.fused_profile = profile(report.pte, inputs, runs=runs, label="fused")
    return report


# -- a small document model, rendered as Markdown or HTML -----------------------------------------

@dataclasses.dataclass
class _Block:
    kind: str  # h2 h3 p ul table chart details
    text: str = ""
    items: list = dataclasses.field(default_factory=list)
    head: list = dataclasses.field(default_factory=list)
    right: int = 0  # columns from this index on are right-aligned numbers


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _graphs_with_fusions(report: Report) -> list[str]:
    graphs = sorted({f.graph or "forward" for f in report.fused}, key=lambda g: (g != "forward", g))
    return graphs


def _ops_changes(report: Report) -> list[list[str]]:
    ops = set(report.ops_before) | set(report.ops_after)
    rows = sorted(ops, key=lambda o: (report.ops_after.get(o, 0) - report.ops_before.get(o, 0), o))
    out = []
    for o in rows:
        b, a = report.ops_before.get(o, 0), report.ops_after.get(o, 0)
        out.append([f"`{o}`", str(b), str(a), f"{a - b:+d}" if a != b else "0"])
    return out


def _summary(report: Report, chart: Optional[ReportFiles]) -> list[str]:
    per_rule = report.fused_per_rule()
    items = []
    n_fused = len(report.fused)
    rules_text = ", ".join(f"{r} {sum(g.values())}" for r, g in per_rule.items()) or "none"
    items.append(f"**{n_fused} fusions** by {len(per_rule)} rules: {rules_text}")
    bodies = [g for g in _graphs_with_fusions(report) if g != "forward"]
    if bodies:
        counts = collections.Counter(f.graph for f in report.fused if f.graph)
        items.append("in control-flow bodies: " + ", ".join(f"`{b}` {counts[b]}" for b in bodies))
    nb, na = sum(report.ops_before.values()), sum(report.ops_after.values())
    items.append(f"**ops {nb} -> {na}** (all graphs, control-flow bodies included)")
    if report.declined or report.near_misses:
        items.append(f"{len(report.declined)} matches declined ({len(report.declined_by_reason())} reasons), "
                     f"{len(report.relevant_near_misses())} near misses")
    if report.max_abs_error is not None:
        rel = f", relative {report.max_rel_error:.2g}" if report.max_rel_error is not None else ""
        items.append(f"runtime vs eager: max abs error {report.max_abs_error:.2g}{rel}")
    if report.speedup is not None:
        items.append(f"**latency {report.latency_stock_ms:.3f} ms -> {report.latency_fused_ms:.3f} ms "
                     f"({report.speedup:.2f}x)** on the ExecuTorch runtime")
    for label, prof in (("stock", report.stock_profile), ("fused", report.fused_profile)):
        if prof is not None and prof.rows:
            items.append(f"time, {label}: " + ", ".join(f"`{r.op}` {_pct(r.share)}" for r in prof.top(3)))
    nxt = report.fuse_next(3)
    if nxt:
        items.append("**what to fuse next**: " + ", ".join(f"`{r.op}` {_pct(r.share)}" for r in nxt))
    elif report.fused_profile is not None:
        items.append("what to fuse next: every op that takes time already has an etfuse rule")
    return items


def _document(report: Report, files: Optional[ReportFiles]) -> tuple[str, list[_Block]]:
    B = _Block
    doc: list[_Block] = [B("h2", "Summary"), B("ul", items=_summary(report, files))]

    # fusions per rule (and per body)
    doc.append(B("h2", "Fusions per rule"))
    per_rule = report.fused_per_rule()
    graphs = _graphs_with_fusions(report)
    if per_rule:
        if len(graphs) > 1:
            rows = [[r, *(str(g.get(name, 0)) for name in graphs), str(sum(g.values()))] for r, g in per_rule.items()]
            doc.append(B("table", head=["rule", *(f"`{g}`" for g in graphs), "total"], items=rows, right=1))
        else:
            doc.append(B("table", head=["rule", "fused"], items=[[r, str(sum(g.values()))] for r, g in per_rule.items()], right=1))
    else:
        doc.append(B("p", "Nothing fused."))

    doc.append(B("h2", "Ops before -> after"))
    doc.append(B("p", "Count of each op over all graphs, control-flow bodies included; most removed first."))
    doc.append(B("table", head=["op", "before", "after", "change"], items=_ops_changes(report), right=1))

    doc.append(B("h2", "Declined"))
    groups = report.declined_by_reason()
    if groups:
        rows = [[rule, why, f"`{ex.node}` in {ex.graph or 'forward'}", str(n)] for rule, why, n, ex in groups]
        doc.append(B("table", head=["rule", "reason", "example", "count"], items=rows, right=3))
    else:
        doc.append(B("p", "No match was declined."))

    doc.append(B("h2", "Near misses"))
    near = report.near_misses_grouped()
    if near:
        doc.append(B("p", "A rule whose anchor op matched where its pattern did not; the first point of "
                          "difference is where the comparison that got furthest failed. Closest first."))
        rows = [[rule, f"{matched}/{size}", f"`{expected}`", found if found.startswith("literal") else f"`{found}`",
                 f"`{ex.node}` in {ex.graph or 'forward'}: {ex.reason}", str(n)]
                for rule, expected, found, matched, size, n, ex in near[:15]]
        doc.append(B("table", head=["rule", "ops matched", "expected", "found", "example", "count"], items=rows, right=5))
        if len(near) > 15:
            doc.append(B("p", f"... and {len(near) - 15} more kinds ({sum(g[5] for g in near[15:])} near misses)."))
    elif report.near_misses_recorded:
        doc.append(B("p", "None: every anchor op a rule looks for either fused or was declined."))
    else:
        doc.append(B("p", "Not recorded (near misses are recorded by `etfuse.report.collect`, or by "
                          "`FusionPass(..., near_misses=True)`)."))

    doc.append(B("h2", "Runtime vs eager"))
    check = []
    if report.max_abs_error is not None:
        check.append(f"max abs error, fused program on the ExecuTorch runtime vs eager PyTorch: {report.max_abs_error:.3g}")
    if report.max_rel_error is not None:
        check.append(f"relative error (max abs error / max |eager output|): {report.max_rel_error:.3g}")
    if report.speedup is not None:
        check.append(f"latency (median Method::execute): stock {report.latency_stock_ms:.3f} ms, "
                     f"fused {report.latency_fused_ms:.3f} ms ({report.speedup:.2f}x)")
    doc.append(B("ul", items=check) if check else B("p", "Not run."))

    doc.append(B("h2", "Time per op"))
    profs = [(label, p) for label, p in (("Stock", report.stock_profile), ("Fused", report.fused_profile)) if p is not None]
    if profs:
        doc.append(B("p", f"ETDump, mean of {profs[0][1].runs} runs; share of the time spent in operators "
                          "(the rows sum to 100%); execute is the whole `Method::execute`."))
        doc.append(B("chart"))
        for label, prof in profs:
            doc.append(B("h3", f"{label}: {prof.total_ms:.3f} ms in operators, execute {prof.execute_ms:.3f} ms "
                               f"(median {prof.execute_median_ms:.3f} ms)"))
            head, rows = prof.table(TOP_OPS)
            doc.append(B("table", head=head, items=[[f"`{r[0]}`" if not r[0].startswith("(") else r[0], *r[1:]] for r in rows], right=1))
        doc.append(B("h2", "What to fuse next"))
        nxt = report.fuse_next(10)
        base = "fused" if report.fused_profile is not None else "stock"
        if nxt:
            doc.append(B("p", f"Ops no etfuse rule covers, ranked by their time in the {base} program."))
            doc.append(B("table", head=["op", "calls", "ms / run", f"share of {base}"],
                         items=[[f"`{r.op}`", str(r.calls), f"{r.total_ms:.3f}", _pct(r.share)] for r in nxt], right=1))
        else:
            doc.append(B("p", "Every op that takes time already has an etfuse rule."))
    else:
        doc.append(B("p", "Not profiled: `etfuse.report.collect(model, inputs)` profiles both programs "
                          "with ETDump (`etfuse fuse ... --profile`)."))

    if report.fused:
        rows = [[f.rule, f.graph or "forward", f"`{f.node}`", ", ".join(f.replaced)] for f in report.fused]
        doc.append(B("details", f"All {len(report.fused)} fusions", items=[B("table", head=["rule", "graph", "new node", "replaced"], items=rows)]))
    return report.title, doc


def _md_inline(text: str) -> str:
    return text.replace("|", "\\|")


def _md_blocks(blocks: list[_Block], files: Optional[ReportFiles], out: list[str]) -> None:
    for b in blocks:
        if b.kind == "h2":
            out += [f"## {b.text}", ""]
        elif b.kind == "h3":
            out += [f"### {b.text}", ""]
        elif b.kind == "p":
            out += [b.text, ""]
        elif b.kind == "ul":
            out += [f"- {i}" for i in b.items] + [""]
        elif b.kind == "table":
            n = len(b.head)
            out.append("| " + " | ".join(_md_inline(h) for h in b.head) + " |")
            out.append("|" + "|".join("---:" if i >= b.right > 0 else "---" for i in range(n)) + "|")
            out += ["| " + " | ".join(_md_inline(c) for c in row) + " |" for row in b.items]
            out.append("")
        elif b.kind == "chart":
            out += [_chart_markdown(files), ""]
        elif b.kind == "details":
            out += ["<details>", f"<summary>{html.escape(b.text)}</summary>", ""]
            _md_blocks(b.items, files, out)
            out += ["</details>", ""]


def _chart_markdown(files: Optional[ReportFiles]) -> str:
    if files is not None and files.png:
        png, svg = os.path.basename(files.png), os.path.basename(files.svg) if files.svg else None
        link = f" ([SVG]({svg}))" if svg else ""
        return f"![time by op, stock vs fused]({png}){link}"
    why = files.chart_missing if files is not None and files.chart_missing else "no chart"
    return f"_Chart of time by op: {why}._"


def render_markdown(report: Report, files: Optional[ReportFiles] = None) -> str:
    """The report as Markdown; `files` says where the chart is (links are relative)."""
    title, blocks = _document(report, files)
    out = [f"# etfuse report: {title}", ""]
    _md_blocks(blocks, files, out)
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1f2328;line-height:1.45}
h1{font-size:1.6em;border-bottom:1px solid #d0d7de;padding-bottom:.3em}h2{font-size:1.3em;margin-top:1.6em;
border-bottom:1px solid #eaeef2;padding-bottom:.2em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}th,td{border:1px solid #d0d7de;padding:4px 10px;
text-align:left;vertical-align:top}th{background:#f6f8fa}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafbfc}code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;
background:#eff1f3;padding:.1em .3em;border-radius:4px}figure{margin:1em 0}figure svg,figure img{max-width:100%;height:auto}
.note{color:#59636e;font-style:italic}
""".strip()


def _html_inline(text: str) -> str:
    """Escape, then `code` and **strong** from the document's small inline markup."""
    parts = text.split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            segs = part.split("**")
            out.append("".join(f"<strong>{html.escape(s)}</strong>" if j % 2 else html.escape(s) for j, s in enumerate(segs)))
    return "".join(out)


def _html_blocks(blocks: list[_Block], chart_html: str, out: list[str]) -> None:
    for b in blocks:
        if b.kind in ("h2", "h3"):
            out.append(f"<{b.kind}>{_html_inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_html_inline(b.text)}</p>")
        elif b.kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            def cls(i):
                return ' class="num"' if i >= b.right > 0 else ""
            out.append("<table><thead><tr>" + "".join(f"<th{cls(i)}>{_html_inline(h)}</th>" for i, h in enumerate(b.head))
                       + "</tr></thead><tbody>")
            out += ["<tr>" + "".join(f"<td{cls(i)}>{_html_inline(c)}</td>" for i, c in enumerate(row)) + "</tr>" for row in b.items]
            out.append("</tbody></table>")
        elif b.kind == "chart":
            out.append(chart_html)
        elif b.kind == "details":
            out.append(f"<details><summary>{_html_inline(b.text)}</summary>")
            _html_blocks(b.items, chart_html, out)
            out.append("</details>")


def render_html(report: Report, files: Optional[ReportFiles] = None, chart_svg: Optional[str] = None) -> str:
    """The report as one self-contained HTML page: the chart is inlined (`chart_svg`, the SVG
    text, or else the PNG of `files` as base64); no external resources."""
    title, blocks = _document(report, files)
    if chart_svg:
        start = chart_svg.find("<svg")
        chart_html = f'<figure role="img" aria-label="time by op, stock vs fused">{chart_svg[start:]}</figure>'
    elif files is not None and files.png and os.path.exists(files.png):
        with open(files.png, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        chart_html = f'<figure><img alt="time by op, stock vs fused" src="data:image/png;base64,{data}"></figure>'
    else:
        why = files.chart_missing if files is not None and files.chart_missing else "no chart"
        chart_html = f'<p class="note">Chart of time by op: {_html_inline(why)}.</p>'
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>etfuse report: {html.escape(title)}</title>", f"<style>{_CSS}</style></head><body>",
           f"<h1>etfuse report: {html.escape(title)}</h1>"]
    _html_blocks(blocks, chart_html, out)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# -- the chart -------------------------------------------------------------------------------------

def write_chart(stock: Optional[OpProfile], fused: Optional[OpProfile], png: str, svg: Optional[str] = None,
                top: int = TOP_CHART) -> Optional[str]:
    """A horizontal bar chart of ms per run by op, stock vs fused, as `png` (and `svg`).
    Returns None when written, else why not (no matplotlib, no profile)."""
    profs = [(label, p) for label, p in (("stock", stock), ("fused", fused)) if p is not None and p.rows]
    if not profs:
        return "no profile to draw"
    try:
        import matplotlib
    except ImportError:
        return f"install matplotlib for it: `{CHART_HINT}`"
    from matplotlib.figure import Figure  # no pyplot: the caller's backend and figures are left alone

    times: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for label, p in profs:
        for r in p.rows:
            times[r.op][label] = r.total_ms
    ops = sorted(times, key=lambda o: -max(times[o].values()))
    shown, rest = ops[:top], ops[top:]
    if rest:
        other = f"({len(rest)} other ops)"
        for label, _ in profs:
            times[other][label] = sum(times[o].get(label, 0.0) for o in rest)
        shown.append(other)
    shown.reverse()  # largest at the top
    colors = {"stock": "#9aa4ae", "fused": "#2f6fdb"}
    height = 0.8 / len(profs)
    fig = Figure(figsize=(9, 0.9 + 0.42 * len(shown) * (1 + 0.3 * (len(profs) - 1))), dpi=110)
    ax = fig.subplots()
    for k, (label, p) in enumerate(profs):
        ys = [i + (k - (len(profs) - 1) / 2) * height * -1 for i in range(len(shown))]
        vals = [times[o].get(label, 0.0) for o in shown]
        bars = ax.barh(ys, vals, height=height, color=colors[label],
                       label=f"{label}: {p.total_ms:.3f} ms in operators")
        for bar, v, o in zip(bars, vals, shown):
            if v > 0:
                share = v / p.total_ms if p.total_ms else 0.0
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.3f} ms ({100 * share:.0f}%)",
                        va="center", fontsize=7.5, color="#333333")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(shown, fontsize=8.5, fontfamily="monospace")
    ax.set_xlabel("ms per run (ETDump, mean)")
    ax.set_title("time by op, stock vs fused", fontsize=11)
    ax.margins(x=0.22)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(png)
    if svg:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "etfuse"}):  # text stays text
            fig.savefig(svg, metadata={"Date": None})
    return None


# -- writing ---------------------------------------------------------------------------------------

def write_report(path: str, result, *, title: str = "", inputs: Optional[Sequence[torch.Tensor]] = None,
                 stock_pte=None, runs: int = 10, chart: bool = True) -> ReportFiles:
    """Write the report to `path`: Markdown for `.md` (or any other suffix), one self-contained
    page for `.html`/`.htm`; the chart goes next to it as `<stem>.png` and `<stem>.svg`.

    `result` is a `Report` (`collect`) or a `ComparisonResult` (`lower_and_compare`). With `inputs`,
    a result that has no profile yet is profiled here: the fused `.pte` (`result.pte`) and the
    stock one (`stock_pte`, else `result.stock_pte`: bytes, a path or a program, see
    `etfuse.profiling.pte_bytes`). Returns where everything went (`ReportFiles`)."""
    report = Report.from_result(result, title=title)  # a copy: the caller's result is not changed
    if inputs is not None:
        stock_pte = stock_pte if stock_pte is not None else report.stock_pte
        if report.fused_profile is None and report.pte is not None:
            report.fused_profile = profile(report.pte, inputs, runs=runs, label="fused")
        if report.stock_profile is None and stock_pte is not None:
            report.stock_profile = profile(stock_pte, inputs, runs=runs, label="stock")
    if not report.title:
        report.title = os.path.splitext(os.path.basename(path))[0]
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(path)[0]
    files = ReportFiles(path)
    svg_text = None
    if chart and (report.stock_profile is not None or report.fused_profile is not None):
        png, svg = stem + ".png", stem + ".svg"
        why = write_chart(report.stock_profile, report.fused_profile, png, svg)
        if why is None:
            files.png, files.svg = png, svg
            with open(svg) as f:
                svg_text = f.read()
        else:
            files.chart_missing = why
    elif chart:
        files.chart_missing = "not profiled"
    is_html = path.lower().endswith((".html", ".htm"))
    text = render_html(report, files, svg_text) if is_html else render_markdown(report, files)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return files


def console_summary(report: Report, files: Optional[ReportFiles] = None, max_lines: int = 29) -> str:
    """A few lines for the terminal (never more than `max_lines`): the summary and where the
    report went; the details live in the report."""
    lines = [f"etfuse: {report.title}"]
    per_rule = report.fused_per_rule()
    shown = list(per_rule.items())[:6]
    more = f", +{len(per_rule) - 6} more rules" if len(per_rule) > 6 else ""
    lines.append(f"  fused {len(report.fused)}: " + (", ".join(f"{r} {sum(g.values())}" for r, g in shown) or "nothing") + more)
    bodies = collections.Counter(f.graph for f in report.fused if f.graph)
    if bodies:
        lines.append("  in bodies: " + ", ".join(f"{b} {n}" for b, n in sorted(bodies.items())[:6])
                     + (f", +{len(bodies) - 6} more" if len(bodies) > 6 else ""))
    lines.append(f"  ops {sum(report.ops_before.values())} -> {sum(report.ops_after.values())}")
    near = report.relevant_near_misses()
    if report.declined or near:
        lines.append(f"  declined {len(report.declined)} ({len(report.declined_by_reason())} reasons), near misses {len(near)}")
    if report.max_abs_error is not None:
        rel = f", relative {report.max_rel_error:.2g}" if report.max_rel_error is not None else ""
        lines.append(f"  runtime vs eager: max abs error {report.max_abs_error:.2g}{rel}")
    if report.speedup is not None:
        lines.append(f"  latency: stock {report.latency_stock_ms:.3f} ms -> fused {report.latency_fused_ms:.3f} ms "
                     f"({report.speedup:.2f}x)")
    for label, prof in (("stock", report.stock_profile), ("fused", report.fused_profile)):
        if prof is not None and prof.rows:
            lines.append(f"  time, {label}: " + ", ".join(f"{r.op} {_pct(r.share)}" for r in prof.top(3)))
    nxt = report.fuse_next(3)
    if nxt:
        lines.append("  fuse next: " + ", ".join(f"{r.op} {_pct(r.share)}" for r in nxt))
    if files is not None:
        extra = [p for p in (files.png, files.svg) if p]
        lines.append(f"report: {files.report}" + (f" (chart: {', '.join(extra)})" if extra else ""))
        if files.chart_missing and (report.stock_profile or report.fused_profile):
            lines.append(f"  no chart: {files.chart_missing.replace('`', '')}")
    return "\n".join(lines[:max_lines])
