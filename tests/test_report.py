"""The HTML compile report: written by `tori report` and by options={"report": path},
opened in a real headless Chromium (Debian's package; tests/setup/system-packages.sh)."""

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import tori
from tori.cli import main

from system_packages import chromium, missing

TESTS = Path(__file__).resolve().parent
CHROMIUM = chromium()


class _Elements(HTMLParser):
    """Tags with their attributes, and the text of the element with id page-status."""

    def __init__(self):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.status = ""
        self._in_status = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        self._in_status = attrs.get("id") == "page-status"

    def handle_data(self, data):
        if self._in_status:
            self.status += data
            self._in_status = False

    def having(self, tag, class_=None, **attrs):
        return [a for t, a in self.elements if t == tag
                and (class_ is None or class_ in (a.get("class") or "").split())
                and all(a.get(k) == v for k, v in attrs.items())]


def parse(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


# One worker: the module fixture `report` is built once.
pytestmark = pytest.mark.xdist_group("report")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    result = CliRunner().invoke(main, ["report", f"{TESTS / 'report_models.py'}:with_graph_break", "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path, result.stdout


def test_report_command_summarizes_the_compile(report):
    path, printed = report
    assert f"wrote {path}" in printed
    assert "2 Dynamo graph(s), 1 graph break(s), 2 of 2 AOT graph(s) compiled" in printed
    assert "graph break at " in printed and "report_models.py:15 in forward: Failed to trace builtin operator" in printed
    assert "output vs eager: matches" in printed


def test_report_holds_stages_diffs_chart_guards_and_graph_breaks(report):
    page = parse(report[0].read_text())
    stages = [a["data-stage"] for a in page.having("details", class_="stage")]
    assert stages.count("torch") == 2 and "tori.02.tori-fold-constants" in stages and "iree-input" in stages
    diffs = page.having("details", class_="diff")
    assert {"data-from": "torch", "data-to": "tori.02.tori-fold-constants"}.items() <= diffs[0].items()
    assert page.having("table", class_="diff")
    bars = page.having("rect", class_="bar")
    assert any(b["data-pass"] == "tori-fold-constants" and float(b["width"]) > 0 for b in bars)
    assert len(page.having("li", class_="graph-break")) == 1
    sections = page.having("section", class_="aot-graph")
    assert len(sections) == 2 and all(int(s["data-dispatches"]) >= 1 for s in sections)
    assert len(page.having("span", class_="compiled")) == 2
    text = report[0].read_text()
    assert "L[&#x27;x&#x27;]: TENSOR_MATCH" in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def test_report_option_writes_the_page_as_graphs_compile(tmp_path):
    path = tmp_path / "from-option.html"
    compiled = torch.compile(lambda x: torch.tanh(x) * 2, backend="tori", options={"report": str(path)})
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), torch.tanh(x) * 2)
    page = parse(path.read_text())
    assert [a["data-stage"] for a in page.having("details", class_="stage")][:3] == ["dynamo", "aten", "torch"]
    assert len(page.having("span", class_="compiled")) == 1


def test_report_renders_in_headless_chromium(report, tmp_path):
    if CHROMIUM is None:
        missing("CHROMIUM")
    path = report[0]
    url = path.as_uri() + "#expand"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000"]
    done = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    page = parse(done.stdout)
    (status,) = page.having("span", id="page-status")
    assert status["data-errors"] == "0" and page.status == "ready"
    assert int(status["data-stages"]) == len(page.having("details", class_="stage")) > 10
    # The script ran: #expand opened every stage and diff.
    assert all("open" in a for a in page.having("details", class_="stage") + page.having("details", class_="diff"))
    assert re.search(r"torch\.aten\.relu", done.stdout) and page.having("rect", class_="bar")
    screenshot = TESTS.parent / "build" / "report-screenshot.png"
    screenshot.parent.mkdir(exist_ok=True)
    shot = subprocess.run(base + ["--window-size=1280,1600", f"--screenshot={screenshot}", url],
                          capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and screenshot.stat().st_size > 20_000
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
