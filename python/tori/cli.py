"""The `tori` command: inspect MLIR and experiment with tori's pipeline.

    tori opt FILE.mlir --pipeline '...'        run a pass pipeline over a file, like mlir-opt
    tori explore MODULE:FACTORY --pipeline A --pipeline B    A/B pipelines on one model
    tori report MODULE:FACTORY -o report.html  the HTML compile report of one model

A subcommand is one function decorated with `@subcommand(...)`; library code logs,
only this module prints.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

from tori.errors import ToriError


class _Group(click.Group):
    """Turns tori's errors into one clear message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ToriError as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what tori does (to stderr).")
def main(verbose: bool) -> None:
    """tori: look at and experiment with the compiler pipeline (docs/inspect.md)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


def subcommand(name: str) -> Callable:
    """Register the decorated function as `tori NAME`."""
    return main.command(name)


def _console(stderr: bool = False) -> Console:
    # Tables keep their width when piped into a file or another program.
    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 160)


def _options(target: str | None, extra: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if target:
        options["target"] = target
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        options[key.strip()] = value
    return options


# ---------------------------------------------------------------------------
# tori opt


@subcommand("opt")
@click.argument("file", type=click.Path(path_type=Path), required=False)
@click.option("--pipeline", "-p", default="", help="MLIR-syntax pipeline of tori and upstream passes.")
@click.option("--print-ir-after-change", is_flag=True, help="Print the IR after each pass that changed it (stderr).")
@click.option("--timing", is_flag=True, help="Print each pass's time (stderr).")
@click.option("--list-passes", is_flag=True, help="List every pass a pipeline can name, one line each.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result here instead of stdout.")
def opt(file: Path | None, pipeline: str, print_ir_after_change: bool, timing: bool, list_passes: bool,
        output: Path | None) -> None:
    """Run a pass pipeline over FILE (MLIR text), like mlir-opt with tori's passes."""
    from tori.frontend.importer import new_context
    from tori.passes import run_pipeline, validate_pipeline
    from tori.tools.mlir_file import parse_mlir_file

    if list_passes:
        from tori.passes.catalog import known_passes

        passes = known_passes()
        width = max(len(name) for name in passes)
        for origin in ("tori", "torch-mlir", "mlir"):
            click.echo(f"{origin} passes:")
            for info in passes.values():
                if info.origin == origin:
                    click.echo(f"  {info.name:<{width}}  {info.description}")
        return
    if file is None:
        raise click.UsageError("FILE is required (or --list-passes)")
    validate_pipeline(pipeline)
    context = new_context()
    module = parse_mlir_file(file, context)

    def after(run) -> None:
        if print_ir_after_change and run.changed:
            click.echo(f"// -----// IR Dump After {run.step.text()} //----- //\n{run.ir_after}", err=True)

    runs = run_pipeline(module, pipeline, graph=file.stem, on_pass=after) if pipeline else []
    if timing:
        table = Table(title="pass timing", title_justify="left")
        table.add_column("pass")
        table.add_column("ms", justify="right")
        table.add_column("changed IR")
        for run in runs:
            table.add_row(run.step.text(), f"{run.seconds * 1e3:.3f}", "yes" if run.changed else "no")
        table.add_row("total", f"{sum(r.seconds for r in runs) * 1e3:.3f}", "")
        _console(stderr=True).print(table)
    text = str(module)
    if output is not None:
        output.write_text(text)
    else:
        click.echo(text, nl=False)


# ---------------------------------------------------------------------------
# tori explore


@subcommand("explore")
@click.argument("model")
@click.option("--pipeline", "-p", "pipelines", multiple=True,
              help="A tori pipeline (repeat for each variant; '' runs no pass).")
@click.option("--iree-flags", "iree_flags", multiple=True,
              help="Extra iree-compile flags, paired with --pipeline in order (one value applies to all).")
@click.option("--seconds", default=2.0, show_default=True, help="Timing budget over all variants.")
@click.option("--target", default=None, help="IREE target (tori.Target).")
@click.option("--option", "extra", multiple=True, help="Any other tori option, KEY=VALUE.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def explore_command(model: str, pipelines: tuple[str, ...], iree_flags: tuple[str, ...], seconds: float,
                    target: str | None, extra: tuple[str, ...], as_json: bool) -> None:
    """Compile MODEL (MODULE:FACTORY returning (model, inputs)) with each pipeline, check
    each against eager, and compare dispatches, compile time and latency."""
    from tori.tools.explore import explore, variants
    from tori.tools.loading import load_model

    variant_list = variants(list(pipelines), list(iree_flags))
    module, inputs = load_model(model)
    outcomes = explore(module, inputs, variant_list, seconds=seconds, options=_options(target, extra))
    if as_json:
        click.echo(json.dumps({"model": model, "variants": [o.as_dict() for o in outcomes]}, indent=2))
        return
    table = Table(title=f"tori explore {model}", title_justify="left")
    for column, justify in (("#", "right"), ("pipeline | iree flags", "left"), ("correct (max error)", "left"),
                            ("dispatches", "right"), ("compile s", "right"), ("median ms", "right"),
                            ("vs #0", "right")):
        table.add_column(column, justify=justify)
    for index, o in enumerate(outcomes):
        if o.error:
            correct = f"error: {o.error}"
        else:
            correct = f"{'yes' if o.correct else 'NO'} ({o.max_error:.1e})" + (f", fell back: {o.fell_back}" if o.fell_back else "")
        table.add_row(str(index), o.variant.label, correct, "-" if o.dispatches is None else str(o.dispatches),
                      "-" if o.compile_s is None else f"{o.compile_s:.2f}",
                      "-" if o.median_ms is None else f"{o.median_ms:.3f}",
                      "-" if o.ratio is None else f"{o.ratio:.2f}x")
    _console().print(table)


# ---------------------------------------------------------------------------
# tori report


@subcommand("report")
@click.argument("model")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("tori-report.html"), show_default=True)
@click.option("--pipeline", "-p", default=None, help="tori pipeline (default: the configured one).")
@click.option("--iree-flags", default=None, help="Extra iree-compile flags.")
@click.option("--target", default=None, help="IREE target (tori.Target).")
@click.option("--option", "extra", multiple=True, help="Any other tori option, KEY=VALUE.")
def report_command(model: str, output: Path, pipeline: str | None, iree_flags: str | None, target: str | None,
                   extra: tuple[str, ...]) -> None:
    """Write the HTML compile report of MODEL (MODULE:FACTORY returning (model, inputs))."""
    from tori.frontend.records import compile_records
    from tori.tools.loading import load_model
    from tori.tools.report import report_model

    options = _options(target, extra)
    if pipeline is not None:
        options["pipeline"] = pipeline
    if iree_flags is not None:
        options["iree_flags"] = iree_flags
    module, inputs = load_model(model)
    seen = {r.name for r in compile_records()}
    path, facts = report_model(module, inputs, output, options=options, name=model)
    records = [r for r in compile_records() if r.name not in seen and Path(r.options.report or "") == output]
    graphs = [g for r in records for g in r.graphs]
    click.echo(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    click.echo(f"  {len(records)} Dynamo graph(s), {len(facts.graph_breaks)} graph break(s), "
               f"{sum(g.compiled is not None for g in graphs)} of {len(graphs)} AOT graph(s) compiled")
    for graph in graphs:
        status = "compiled" if graph.compiled is not None else f"fell back: {graph.error.reason.splitlines()[0] if graph.error else '?'}"
        passes = ", ".join(f"{r.step.name} {r.seconds * 1e3:.1f} ms" for r in graph.passes) or "no passes"
        click.echo(f"  {graph.name}: {status}; {passes}")
    for found in facts.graph_breaks:
        click.echo(f"  graph break at {found.where}: {found.reason.splitlines()[0]}")
    click.echo(f"  output vs eager: {'matches' if facts.correct else 'DIFFERS'} (max error {facts.max_error:.1e})")


if __name__ == "__main__":
    main()
