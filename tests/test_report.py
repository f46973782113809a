"""The fusion report (`etfuse.report`), per-op profiles (`etfuse.profile`) and near misses.

Models: the demo model (linear+relu, residual add+relu, a cond), a MobileNetV2-style network
(inverted residual blocks: conv+bn+relu6, depthwise, linear bottleneck), a model whose cond
branches fuse, and one built so that an op etfuse has no rule for (bilinear upsampling) dominates.
Each model is collected once (small inputs, few runs).
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

import etfuse
import etfuse.report as R
from etfuse.cli import DemoModel
from etfuse.profiling import OpProfile, op_base
from fusion_helpers import eval_with_bn_stats

SECTIONS = ["Summary", "Fusions per rule", "Ops before -> after", "Declined", "Near misses",
            "Runtime vs eager", "Time per op", "What to fuse next"]


# -- models ---------------------------------------------------------------------------------------

def _conv_bn(cin, cout, k, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.block = nn.Sequential(_conv_bn(cin, hidden, 1), _conv_bn(hidden, hidden, 3, stride, groups=hidden),
                                   _conv_bn(hidden, cout, 1, act=False))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class TinyMobileNetV2(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2)
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1, 1), InvertedResidual(8, 12, 2, 4),
                                    InvertedResidual(12, 12, 1, 4))
        self.head = _conv_bn(12, 32, 1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


class CondModel(nn.Module):
    """Both branches of the cond fuse: linear+relu in one, linear and add+relu in the other."""

    def __init__(self, width=32):
        super().__init__()
        self.fc, self.a, self.b = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.fc(x))

        def big(h):
            return torch.relu(self.a(h)) + h

        def small(h):
            return torch.relu(self.b(h) + h)

        return torch.cond(h.sum() > 0, big, small, (h,))


class UpsampleDominated(nn.Module):
    """A tiny 1x1 conv+relu, then two bilinear upsamplings: etfuse has no rule for them."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        for _ in range(2):
            y = nn.functional.interpolate(y, scale_factor=2, mode="bilinear")
        return y


class SharedConv(nn.Module):
    """conv -> relu, but the conv's output is also added: conv2d_relu is a near miss."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) + y


MODELS = {
    "demo": lambda: (DemoModel(64).eval(), (torch.randn(8, 64),)),
    "mobilenet_v2": lambda: (eval_with_bn_stats(TinyMobileNetV2()), (torch.randn(1, 3, 32, 32),)),
    "cond": lambda: (CondModel().eval(), (torch.randn(4, 32),)),
    "pool": lambda: (UpsampleDominated().eval(), (torch.randn(1, 8, 16, 16),)),
}


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def collected(out_dir):
    """name -> (Report, ReportFiles of the .md)."""
    torch.manual_seed(0)
    done = {}
    for name, make in MODELS.items():
        model, inputs = make()
        report = R.collect(model, inputs, title=name, runs=3, latency_runs=3)
        done[name] = (report, R.write_report(str(out_dir / f"{name}.md"), report))
    return done


def _section_order(markdown: str) -> list[str]:
    return [line[3:] for line in markdown.splitlines() if line.startswith("## ")]


def _table_after(markdown: str, heading: str) -> list[list[str]]:
    """Rows (cells) of the first table after the line starting with `heading`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows, seen = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif seen:
            break
    return rows[2:]  # header and alignment rows off


# -- the report -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_report_has_the_sections_summary_first(collected, name):
    report, files = collected[name]
    text = open(files.report).read()
    assert text.startswith(f"# etfuse report: {name}\n")
    order = _section_order(text)
    assert order[0] == "Summary"
    assert [s for s in order if s in SECTIONS] == SECTIONS
    summary = text.split("## Summary")[1].split("\n## ")[0]
    assert "fusions** by" in summary and "**ops " in summary and "runtime vs eager: max abs error" in summary
    assert "time, stock:" in summary and "time, fused:" in summary
    assert report.max_abs_error is not None and report.max_abs_error < 1e-3
    assert report.max_rel_error is not None and report.max_rel_error < 1e-4
    assert sum(report.ops_after.values()) < sum(report.ops_before.values())


@pytest.mark.parametrize("name", list(MODELS))
def test_chart_exists_and_is_linked(collected, name):
    _, files = collected[name]
    assert files.png and files.svg and files.chart_missing is None
    assert os.path.getsize(files.png) > 5000 and open(files.png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    svg = open(files.svg).read()
    assert "<svg" in svg and "time by op" in svg  # text kept as text
    text = open(files.report).read()
    assert f"]({os.path.basename(files.png)})" in text and f"]({os.path.basename(files.svg)})" in text


@pytest.mark.parametrize("name", list(MODELS))
def test_per_op_shares_sum_to_100_percent(collected, name):
    report, files = collected[name]
    text = open(files.report).read()
    for label, prof in (("Stock", report.stock_profile), ("Fused", report.fused_profile)):
        assert isinstance(prof, OpProfile) and prof.rows
        assert sum(r.share for r in prof.rows) == pytest.approx(1.0, abs=1e-9)
        assert prof.total_ms == pytest.approx(sum(r.total_ms for r in prof.rows))
        assert prof.total_ms <= prof.execute_ms * 1.01  # operators run inside Method::execute (means add up)
        rows = _table_after(text, f"### {label}:")
        printed = [float(r[-1].rstrip("%")) for r in rows]
        assert sum(printed) == pytest.approx(100.0, abs=0.06 * len(printed) + 0.01)


def test_mobilenet_v2_style_fuses_conv_bn_relu6_and_depthwise(collected):
    report, files = collected["mobilenet_v2"]
    per_rule = {r: sum(g.values()) for r, g in report.fused_per_rule().items()}
    assert per_rule["conv2d_bn_hardtanh"] == 8  # conv + bn + relu6, depthwise included
    assert per_rule["conv2d_bn"] == 1  # the linear bottleneck (no activation) of the block without a skip
    assert per_rule["conv2d_bn_residual"] == 2  # those of the two with one: the add in the conv's epilogue
    assert "batch_norm_fold" not in per_rule and "conv2d_hardtanh" not in per_rule  # every conv has its batch norm
    # the most time goes to a fused conv; which of the two (unpacked or prepacked weight) is timing
    assert report.fused_profile.rows[0].op in ("etfuse::conv2d_bn_act", "etfuse::conv2d_bn_packed_act")
    assert report.stock_profile.get("aten::convolution") is not None
    text = open(files.report).read()
    assert "| conv2d_bn_hardtanh | 8 |" in text


def test_cond_report_counts_fusions_per_body(collected):
    report, files = collected["cond"]
    bodies = {f.graph for f in report.fused if f.graph}
    assert len(bodies) == 2, report.fused  # each branch fused something
    text = open(files.report).read()
    head = next(line for line in text.splitlines() if line.startswith("| rule | `forward`"))
    for body in bodies:
        assert f"`{body}`" in head
    assert "in control-flow bodies:" in text.split("## Fusions per rule")[0]


def test_what_to_fuse_next_names_the_dominating_op(collected):
    report, files = collected["pool"]
    assert op_base(report.stock_profile.rows[0].op) == "upsample_bilinear2d"
    nxt = report.fuse_next()
    assert nxt and op_base(nxt[0].op) == "upsample_bilinear2d" and nxt[0].share > 0.5
    assert all(op_base(r.op) not in R.rule_ops() for r in nxt)
    text = open(files.report).read()
    first = _table_after(text, "## What to fuse next")[0]
    assert first[0] == "`aten::upsample_bilinear2d`"
    assert "**what to fuse next**: `aten::upsample_bilinear2d`" in text
    assert "fuse next: aten::upsample_bilinear2d" in R.console_summary(report, files)


def test_ops_with_rules_are_not_suggested(collected):
    covered = R.rule_ops()
    for op in ("add", "relu", "addmm", "convolution", "hardtanh", "conv2d_act", "linear_relu", "quantize_per_tensor"):
        assert op in covered
    for op in ("upsample_bilinear2d", "cumsum", "sin"):
        assert op not in covered
    report, _ = collected["demo"]
    assert [op_base(r.op) for r in report.fuse_next()] == [op_base(r.op) for r in report.fused_profile.rows
                                                           if op_base(r.op) == "gt"]  # mean: a rule covers it (over H, W)


def test_near_misses_name_the_first_difference():
    from etfuse.passes import GemmConvFusionPass

    model, inputs = SharedConv().eval(), (torch.randn(1, 4, 8, 8),)
    gm = etfuse.to_edge(torch.export.export(model, inputs)).exported_program().graph_module
    quiet, asked = GemmConvFusionPass(), GemmConvFusionPass()
    asked.near_misses = True
    a, b = quiet(gm).graph_module, asked(gm).graph_module
    assert quiet.report.near_misses == []  # only when asked
    assert [f.rule for f in quiet.report.fused] == [f.rule for f in asked.report.fused] == ["conv2d"]
    assert a.code == b.code
    (miss,) = [m for m in asked.report.near_misses if m.rule == "conv2d_relu"]
    assert miss.expected == "aten.convolution.default" and miss.found == "aten.convolution.default with other users"
    assert "also used outside the match" in miss.reason and miss.matched == miss.size == 2


def test_near_misses_in_the_report(out_dir):
    model, inputs = SharedConv().eval(), (torch.randn(1, 4, 8, 8),)
    report = R.collect(model, inputs, title="shared", profile_ops=False, latency_runs=2)
    rows = report.near_misses_grouped()
    assert rows[0][0] == "conv2d_relu" and rows[0][3] == rows[0][4] == 2  # closest first
    files = R.write_report(str(out_dir / "shared.md"), report)
    text = open(files.report).read()
    near = text.split("## Near misses")[1].split("\n## ")[0]
    assert "| conv2d_relu | 2/2 | `aten.convolution.default` |" in near and "also used outside the match" in near
    assert "Not profiled" in text and files.png is None and files.chart_missing == "not profiled"


def test_declined_grouped_by_reason():
    from etfuse.passes import Declined, Fused

    declined = [Declined("add_relu", "", f"add_{i}", "other is float64") for i in range(5)]
    declined.append(Declined("add_relu", "true_graph_0", "add_9", "self has rank 5"))
    report = R.Report("t", {"aten.add.Tensor": 6}, {"aten.add.Tensor": 6}, fused=[Fused("linear", "", "n", ["a", "b"])],
                      declined=declined)
    assert report.declined_by_reason()[0][:3] == ("add_relu", "other is float64", 5)
    rows = _table_after(R.render_markdown(report), "## Declined")
    assert rows == [["add_relu", "other is float64", "`add_0` in forward", "5"],
                    ["add_relu", "self has rank 5", "`add_9` in true_graph_0", "1"]]


# -- HTML -----------------------------------------------------------------------------------------

class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.h2, self.external, self._in_h2 = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_h2 = tag == "h2"
        if self._in_h2:
            self.h2.append("")
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith(("data:", "#")):
                self.external.append(v)
        if tag in ("script", "link", "iframe"):
            self.external.append(tag)

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data


def _chromium():
    for path in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if path and os.path.exists(path):
            return path
    return None


def test_html_report_is_one_self_contained_page(collected, out_dir):
    report, _ = collected["mobilenet_v2"]
    files = R.write_report(str(out_dir / "mobilenet_v2.html"), report)
    page = _Page()
    page.feed(open(files.report, encoding="utf-8").read())
    assert page.tags.count("html") == 1 and "svg" in page.tags  # chart inlined
    assert [h for h in page.h2 if h in SECTIONS] == SECTIONS
    # a table per section, "what to fuse next" only when something is left (here: nothing, the
    # global mean fuses too)
    assert page.tags.count("table") >= 5 + bool(report.fuse_next())
    assert page.external == []  # no script, stylesheet or image outside the page
    text = open(files.report, encoding="utf-8").read()
    assert "<code>etfuse::conv2d_bn_act</code>" in text


def test_html_report_in_a_headless_browser(collected, out_dir):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium here: the HTML is checked by parsing (test_html_report_is_one_self_contained_page)")
    report, _ = collected["pool"]
    files = R.write_report(str(out_dir / "pool.html"), report)
    shot = out_dir / "pool.png.screenshot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    f"--screenshot={shot}", "--window-size=1200,2400", f"file://{files.report}"],
                   check=True, timeout=120, capture_output=True)
    assert shot.exists() and shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_without_matplotlib_the_report_says_how_to_get_the_chart(collected, out_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    report, _ = collected["demo"]
    files = R.write_report(str(out_dir / "nompl" / "demo.md"), report)
    assert files.png is None and R.CHART_HINT in files.chart_missing
    assert not os.path.exists(out_dir / "nompl" / "demo.png")
    assert 'pip install "etfuse[report]"' in open(files.report).read()
    page = R.write_report(str(out_dir / "nompl" / "demo.html"), report)
    assert "pip install &quot;etfuse[report]&quot;" in open(page.report).read()


# -- console --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_console_summary_is_short(collected, name):
    report, files = collected[name]
    text = R.console_summary(report, files)
    lines = text.splitlines()
    assert len(lines) < 30 and lines[-1].startswith("report: ")
    assert any("runtime vs eager" in line for line in lines)


def test_console_summary_stays_short_for_a_huge_model():
    from etfuse.passes import Declined, Fused, NearMiss

    fused = [Fused(f"rule_{i % 40}", f"body_{i % 30}" if i % 2 else "", f"n{i}", ["x"]) for i in range(500)]
    declined = [Declined(f"rule_{i % 7}", "", f"d{i}", f"reason {i % 50}") for i in range(300)]
    near = [NearMiss("r", "", f"m{i}", "aten.add.Tensor", "getitem", "why", 1, 2) for i in range(300)]
    report = R.Report("huge", {f"op{i}": 10 for i in range(200)}, {f"op{i}": 5 for i in range(200)},
                      fused=fused, declined=declined, near_misses=near, max_abs_error=1e-6, max_rel_error=1e-7,
                      latency_stock_ms=10.0, latency_fused_ms=2.0)
    lines = R.console_summary(report, R.ReportFiles("r.md")).splitlines()
    assert len(lines) < 30 and all(len(line) < 200 for line in lines)


# -- the profile API and the CLI's entry -------------------------------------------------------------

def test_profile_takes_bytes_paths_and_programs(tmp_path):
    model, inputs = UpsampleDominated().eval(), (torch.randn(1, 8, 8, 8),)
    edge = etfuse.to_edge(torch.export.export(model, inputs))
    code = edge.exported_program().graph_module.code
    fused = etfuse.fuse(edge)
    pte = fused.to_executorch().buffer
    path = tmp_path / "m.pte"
    path.write_bytes(pte)
    assert R.profile is etfuse.profiling.profile
    from_bytes = etfuse.profile(pte, inputs, runs=2)
    from_path = R.profile(str(path), inputs, runs=2)
    from_program = etfuse.profile(fused, inputs, runs=2, label="fused")
    stock = etfuse.profile(edge, inputs, runs=2)
    assert edge.exported_program().graph_module.code == code  # the caller's program is not lowered in place
    for prof in (from_bytes, from_path, from_program):
        # the 1x1 conv on an 8x8 map runs on weights packed at fuse time (PrepackWeightsPass)
        assert {r.op for r in prof} == {"etfuse::conv2d_packed_act", "aten::upsample_bilinear2d"}
        assert [r.calls for r in prof if r.op == "aten::upsample_bilinear2d"] == [2]
    assert {op_base(r.op) for r in stock} == {"convolution", "relu", "upsample_bilinear2d"}
    md = from_program.to_markdown(top=1)
    assert md.splitlines()[0] == "| op | calls | ms / run | share |" and "(1 other ops)" in md
    assert "fused:" in str(from_program)


def test_write_report_from_a_lowering_result(tmp_path):
    from etfuse.compare import lower_and_compare

    model, inputs = UpsampleDominated().eval(), (torch.randn(1, 8, 16, 16),)
    ep = torch.export.export(model, inputs)
    result = lower_and_compare(ep, inputs, runs=2)
    stock = etfuse.to_edge(ep)
    files = R.write_report(str(tmp_path / "r.md"), result, title="from result", inputs=inputs, stock_pte=stock, runs=2)
    text = open(files.report).read()
    assert [s for s in _section_order(text) if s in SECTIONS] == SECTIONS
    assert files.png and os.path.exists(files.png)
    assert "`aten::upsample_bilinear2d`" in _table_after(text, "## What to fuse next")[0][0]
    assert re.search(r"latency \d+\.\d+ ms -> \d+\.\d+ ms", text)


def test_collect_without_profiling_then_profile_when_writing(tmp_path):
    """The CLI's route: `collect(..., profile_ops=False)` gives the .pte to write; `--profile` adds
    the per-op time when the report is written."""
    model, inputs = UpsampleDominated().eval(), (torch.randn(1, 8, 8, 8),)
    report = R.collect(model, inputs, profile_ops=False, latency_runs=2)
    assert report.title == "UpsampleDominated" and report.stock_profile is None and report.fused_profile is None
    assert report.pte[4:8] == b"ET12" and report.stock_pte[4:8] == b"ET12"  # .pte files to write
    assert "pte=" not in repr(report)
    files = R.write_report(str(tmp_path / "r.html"), report, inputs=inputs, runs=2)
    assert files.png and report.fused_profile is None  # profiled a copy: the caller's report is unchanged
    text = open(files.report).read()
    assert "<h2>What to fuse next</h2>" in text and "<code>aten::upsample_bilinear2d</code>" in text
