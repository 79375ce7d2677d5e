"""The compile report: one self-contained HTML page (no server, no network) with the
graphs Dynamo captured, why each graph break happened, every stage's IR coloured, diffs
between consecutive stages, pass timings as a bar chart, dispatch counts, guards, and
whether each graph ran compiled or fell back and why.
"""

from __future__ import annotations

import difflib
import html
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pygments
from mlir_pygments import MLIRLexer
from pygments.formatters import HtmlFormatter
from pygments.lexers import BashLexer, PythonLexer

from tori.cache import content_hash, graph_key
from tori.config import Options
from tori.distributed import per_rank
from tori.frontend.records import CompileRecord, GraphRecord, compile_records
from tori.stages import Stage
from tori.tools.dump import stage_texts

log = logging.getLogger("tori.report")

_LEXERS = {"py": PythonLexer, "mlir": MLIRLexer, "sh": BashLexer}
_lock = threading.Lock()
_dispatch_counts: dict[tuple[str, str], int | None] = {}


@dataclass(frozen=True)
class GraphBreak:
    reason: str
    where: str  # file:line of the user code, when Dynamo knows it


@dataclass
class RunFacts:
    """What the report's caller learned by running the model: graph breaks, its check."""

    model: str = ""
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    max_error: float | None = None
    correct: bool | None = None
    seconds: float | None = None


def graph_breaks(fn: Callable, inputs: tuple) -> list[GraphBreak]:
    """Dynamo's graph breaks for `fn` on `inputs`, from torch._dynamo.explain."""
    import torch._dynamo

    explained = torch._dynamo.explain(fn)(*inputs)
    found = []
    for reason in explained.break_reasons:
        stack = list(reason.user_stack or [])
        where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else ""
        found.append(GraphBreak(reason.reason.strip(), where))
    return found


def _dispatches(graph: GraphRecord, options: Options) -> int | None:
    if graph.iree_input is None or graph.compiled is None:
        return None
    key = (graph.name, content_hash(graph.iree_input, options.iree_flags))
    with _lock:
        if key in _dispatch_counts:
            return _dispatch_counts[key]
    from torch_mlir import ir

    from tori.frontend.importer import new_context
    from tori.targets.dispatches import count_dispatches

    try:
        module = ir.Module.parse(graph.iree_input, context=new_context())
        count = count_dispatches(module, target=options.target, options=options).count
    except Exception as error:  # noqa: BLE001 - the report shows what it could count
        log.warning("could not count the dispatches of %s: %s", graph.name, error)
        count = None
    with _lock:
        _dispatch_counts[key] = count
    return count


def _highlight(text: str, suffix: str, formatter: HtmlFormatter) -> str:
    return pygments.highlight(text, _LEXERS.get(suffix, PythonLexer)(), formatter)


def _pass_chart(graph: GraphRecord) -> str:
    if not graph.passes:
        return '<p class="no-passes">No tori pass ran (empty pipeline).</p>'
    longest = max(run.seconds for run in graph.passes) or 1e-9
    bar_height, label_width, width = 22, 260, 420
    rows = []
    for index, run in enumerate(graph.passes):
        y = index * bar_height
        bar = max(1.0, width * run.seconds / longest)
        name = html.escape(run.step.text())
        rows.append(
            f'<text x="0" y="{y + 15}" class="label">{name}</text>'
            f'<rect class="bar{" changed" if run.changed else ""}" data-pass="{name}" x="{label_width}" y="{y + 3}" '
            f'width="{bar:.1f}" height="{bar_height - 6}"><title>{name}: {run.seconds * 1e3:.2f} ms'
            f'{", changed the IR" if run.changed else ", no change"}</title></rect>'
            f'<text x="{label_width + bar + 6:.1f}" y="{y + 15}" class="value">{run.seconds * 1e3:.2f} ms</text>')
    height = bar_height * len(graph.passes)
    return (f'<svg class="pass-chart" xmlns="http://www.w3.org/2000/svg" width="{label_width + width + 90}" '
            f'height="{height}" role="img" aria-label="pass timings">{"".join(rows)}</svg>'
            '<p class="legend"><span class="swatch changed"></span> changed the IR '
            '<span class="swatch"></span> no change</p>')


def _diffs(texts: list[tuple[str, str, str]]) -> str:
    mlir = [(name, text) for name, suffix, text in texts if suffix == "mlir"]
    parts = []
    differ = difflib.HtmlDiff(wrapcolumn=100)
    for (before_name, before), (after_name, after) in zip(mlir, mlir[1:]):
        title = f"{html.escape(before_name)} &rarr; {html.escape(after_name)}"
        if before == after:
            body = '<p class="same">No change.</p>'
        else:
            body = differ.make_table(before.splitlines(), after.splitlines(), before_name, after_name,
                                     context=True, numlines=2)
        parts.append(f'<details class="diff" data-from="{html.escape(before_name)}" data-to="{html.escape(after_name)}">'
                     f"<summary>{title}</summary>{body}</details>")
    return "".join(parts) or "<p>No MLIR stages to compare.</p>"


def _graph_section(graph: GraphRecord, options: Options, formatter: HtmlFormatter) -> str:
    parts = ""
    if graph.compiled is not None:
        status = '<span class="status compiled">ran compiled</span>'
    elif graph.partitioned:
        error = graph.error
        why = f" after stage {error.stage}{', op ' + error.op if error.op else ''}" if error is not None else ""
        status = f'<span class="status partitioned">{html.escape(graph.status + why)}</span>'
        parts = "".join(_graph_section(part, options, formatter) for part in graph.parts)
    else:
        error = graph.error
        why = html.escape(error.reason.splitlines()[0]) if error is not None else "not compiled"
        where = f" (stage {html.escape(error.stage)}{', op ' + html.escape(error.op) if error and error.op else ''})" if error else ""
        status = f'<span class="status fell-back">fell back to eager PyTorch{where}: {why}</span>'
    texts = stage_texts(graph, options.dump_large_constants)
    flags = options.iree_flags
    dispatches = _dispatches(graph, options)
    facts = [
        ("kind", graph.kind), ("compile time", f"{graph.compile_seconds:.3f} s"),
        ("IREE dispatches", "-" if dispatches is None else str(dispatches)),
        ("tori pipeline", options.tori_pipeline or "(none)"), ("target", options.target.value),
        ("extra iree-compile flags", " ".join(flags) or "(none)"),
        ("content hash (compile cache key)",
         (graph_key(graph, options) or "-")[:16]),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    stages = "".join(
        f'<details class="stage" data-stage="{html.escape(name)}"><summary>{number:02d} {html.escape(name)} '
        f'<small>({len(text.splitlines())} lines)</small></summary>{_highlight(text, suffix, formatter)}</details>'
        for number, (name, suffix, text) in enumerate(texts))
    return (f'<section class="aot-graph" id="{html.escape(graph.name)}" data-dispatches="{dispatches if dispatches is not None else ""}">'
            f"<h3>{html.escape(graph.name)} {status}</h3><table class=\"facts\">{rows}</table>"
            f"<h4>Pass timings</h4>{_pass_chart(graph)}"
            f"<h4>Stages</h4>{stages}<h4>Diffs between consecutive MLIR stages</h4>{_diffs(texts)}{parts}</section>")


def _record_section(record: CompileRecord, formatter: HtmlFormatter) -> str:
    guards = next((g.guards for g in record.graphs if g.guards), ())
    guard_list = "".join(f"<li>{html.escape(g)}</li>" for g in guards) or "<li>none recorded</li>"
    if record.error is not None:
        body = (f'<p><span class="status fell-back">fell back to eager PyTorch (stage {html.escape(record.error.stage)}): '
                f"{html.escape(record.error.reason.splitlines()[0])}</span></p>")
    else:
        body = "".join(_graph_section(g, record.options, formatter) for g in record.graphs)
    where = "".join(f" <small>({html.escape(text)})</small>" for text in (
        f"rank {record.rank}" if record.rank is not None else "",
        f"DDP bucket {record.ddp_bucket}" if record.ddp_bucket is not None else "") if text)
    return (f'<section class="dynamo-graph" id="{html.escape(record.name)}"><h2>Dynamo graph {html.escape(record.name)}{where}</h2>'
            f'<details class="guards"><summary>{len(guards)} guards</summary><ul>{guard_list}</ul></details>'
            f"{body}</section>")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { border-bottom: 1px solid #ccc; } h3 { font-size: 1.05em; }
section.aot-graph { margin-left: 1em; }
details { margin: 0.3em 0; } summary { cursor: pointer; font-family: monospace; }
.status { font-weight: normal; font-size: 0.9em; padding: 0.1em 0.4em; border-radius: 3px; }
.status.compiled { background: #d9f2d9; } .status.fell-back { background: #f8d7d7; }
.status.partitioned { background: #fbeec1; }
table.facts th { text-align: left; padding-right: 1em; font-weight: normal; color: #555; }
.highlight pre { font-size: 12px; overflow-x: auto; background: #f8f8f8; padding: 0.5em; }
svg.pass-chart text { font: 12px monospace; } svg.pass-chart rect.bar { fill: #9ab; }
svg.pass-chart rect.bar.changed { fill: #2a7; }
.swatch { display: inline-block; width: 10px; height: 10px; background: #9ab; }
.swatch.changed { background: #2a7; }
table.diff { font: 12px monospace; border-collapse: collapse; } .diff_header { background: #eee; }
.diff_add { background: #aaffaa; } .diff_chg { background: #ffff77; } .diff_sub { background: #ffaaaa; }
td.diff_next { display: none; }
"""

# Records script errors into the page, so a headless browser can read them from the DOM.
_SCRIPT = """
window.__toriErrors = [];
window.addEventListener("error", function (event) { window.__toriErrors.push(String(event.message)); });
document.addEventListener("DOMContentLoaded", function () {
  var toggle = document.getElementById("expand-all");
  toggle.addEventListener("click", function () {
    var open = toggle.dataset.open !== "1";
    document.querySelectorAll("details.stage, details.diff").forEach(function (d) { d.open = open; });
    toggle.dataset.open = open ? "1" : "0";
  });
  if (location.hash === "#expand") { toggle.click(); }
  var status = document.getElementById("page-status");
  status.dataset.errors = String(window.__toriErrors.length);
  status.dataset.stages = String(document.querySelectorAll("details.stage").length);
  status.textContent = window.__toriErrors.length ? "script errors: " + window.__toriErrors.join("; ") : "ready";
});
"""


def render(records: list[CompileRecord], facts: RunFacts | None = None) -> str:
    facts = facts or RunFacts()
    formatter = HtmlFormatter(cssclass="highlight")
    breaks = "".join(
        f'<li class="graph-break"><pre>{html.escape(b.reason)}</pre><small>{html.escape(b.where)}</small></li>'
        for b in facts.graph_breaks)
    graphs = sum(len(r.graphs) for r in records)
    compiled = sum(1 for r in records for g in r.graphs if g.compiled is not None)
    partitioned = sum(1 for r in records for g in r.graphs if g.partitioned)
    summary = [f"{len(records)} Dynamo graph(s), {graphs} AOT graph(s), {compiled} compiled, "
               + (f"{partitioned} partitioned, " if partitioned else "")
               + f"{graphs - compiled - partitioned} fell back; {len(facts.graph_breaks)} graph break(s)"]
    if facts.correct is not None:
        summary.append(f"output vs eager: {'matches' if facts.correct else 'DIFFERS'} (max error {facts.max_error:.3g})")
    title = f"tori compile report{': ' + facts.model if facts.model else ''}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<script>{_SCRIPT}</script>
<style>{_STYLE}{formatter.get_style_defs('.highlight')}</style></head>
<body><h1>{html.escape(title)}</h1>
<p class="summary">{html.escape('; '.join(summary))}. Written {time.strftime('%Y-%m-%d %H:%M:%S')}.
<button id="expand-all" type="button">expand / collapse all</button> <span id="page-status">loading</span></p>
<section id="graph-breaks"><h2>Graph breaks</h2>{f'<ol>{breaks}</ol>' if breaks else '<p>None.</p>'}</section>
{''.join(_record_section(r, formatter) for r in records)}
</body></html>
"""


def write_report(path: Path | str, *, options: Options | None = None, records: list[CompileRecord] | None = None,
                 facts: RunFacts | None = None) -> Path:
    """Write the report of `records` (default: every record compiled with option
    `report` set to `path`) to `path` (under torch.distributed, to this rank's file:
    `report.rank1.html`)."""
    path = Path(path)
    if records is None:
        records = [r for r in compile_records() if r.options.report is not None and Path(r.options.report) == path]
    path = per_rank(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(records, facts))
    return path


def report_model(model: Callable, inputs: tuple, path: Path | str, *, options: dict[str, Any] | None = None,
                 name: str = "") -> tuple[Path, RunFacts]:
    """Capture `model` (graph breaks), compile and run it with tori once, check it
    against eager, and write the report to `path`."""
    import torch

    path = Path(path)
    facts = RunFacts(model=name)
    seen = {r.name for r in compile_records()}
    with torch.no_grad():
        expected = model(*inputs)
        facts.graph_breaks = graph_breaks(model, inputs)
        start = time.perf_counter()
        compiled = torch.compile(model, backend="tori", options={**(options or {}), "report": str(path)})
        actual = compiled(*inputs)
        facts.seconds = time.perf_counter() - start
    from tori.tools.explore import ATOL, RTOL, _max_error

    facts.max_error = _max_error(actual, expected)
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
        facts.correct = True
    except AssertionError:
        facts.correct = False
    records = [r for r in compile_records() if r.name not in seen]
    written = write_report(path, records=records, facts=facts)
    log.info("report of %s: %d Dynamo graph(s), %d graph break(s), compiled and ran in %.2f s; written to %s",
             name or "the model", len(records), len(facts.graph_breaks), facts.seconds, written)
    return written, facts
