"""The `tori` command: inspect MLIR and experiment with tori's pipeline.

    tori opt FILE.mlir --pipeline '...'        run a pass pipeline over a file, like mlir-opt
    tori explore MODULE:FACTORY --pipeline A --pipeline B    A/B pipelines on one model
    tori report MODULE:FACTORY -o report.html  the HTML compile report of one model
    tori export MODULE:FACTORY -o out/ --target cpu,vulkan   an artifact folder (docs/export.md)
    tori run out/ --input x.npy                run an artifact with IREE's runtime and numpy
    tori profile MODULE:FACTORY --calls 20     time per IREE dispatch, with the torch ops behind each

A subcommand is one function decorated with `@subcommand(...)`; library code logs,
only this module prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.table import Table

from tori.errors import ArtifactError, InputError, OptionsError, ToriError

# A mistake in what the user gave (an option, a file, a path): exit status 2, as click's
# own usage errors; a model that does not compile or run: 1.
USER_MISTAKE, FAILED = 2, 1


class _Group(click.Group):
    """Turns tori's errors, and a path that cannot be read or written, into one clear
    `error:` message and an exit status: never a traceback for the user's mistake."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OptionsError, InputError, ArtifactError) as error:
            _fail(ctx, _cli_message(error), USER_MISTAKE)
        except click.UsageError as error:  # raised by a subcommand's own checks
            _fail(ctx, error.format_message(), USER_MISTAKE)
        except ToriError as error:
            _fail(ctx, str(error), FAILED)
        except OSError as error:
            where = f"{error.filename}: " if error.filename is not None else ""
            _fail(ctx, f"{where}{error.strerror or error}; check the path and that it can be read or written",
                  USER_MISTAKE)


def _fail(ctx: click.Context, message: str, status: int) -> None:
    click.echo(f"error: {message}", err=True)
    ctx.exit(status)


def _cli_message(error: ToriError) -> str:
    """The message, with a hint meant for Python callers replaced by the option's CLI form."""
    if isinstance(error, OptionsError) and error.what == "tori option":
        return f"{error.bare}; pass tori options as --option KEY=VALUE"
    return str(error)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from tori.cache import package_versions

        click.echo("  ".join(f"{name} {version}" for name, version in package_versions().items()))
        ctx.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what tori does, each stage with its time (to stderr).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the versions of tori, torch, torch-mlir and IREE, and exit.")
def main(verbose: bool) -> None:
    """tori: look at and experiment with the compiler pipeline (docs/inspect.md)."""
    from tori.logs import configure

    configure("info" if verbose else None)


def subcommand(name: str) -> Callable:
    """Register the decorated function as `tori NAME`."""
    return main.command(name)


class _LatestStage(logging.Handler):
    """Keeps the message of the latest `tori.stage` record."""

    def __init__(self, first: str):
        super().__init__(logging.INFO)
        self.latest = first

    def emit(self, record: logging.LogRecord) -> None:
        self.latest = record.getMessage()


@contextlib.contextmanager
def progress(what: str, console: Console | None = None, delay_s: float = 2.0) -> Iterator[None]:
    """While `what` runs longer than `delay_s`: its latest stage and the time so far, on
    stderr when it is a terminal. Library code only logs its stages (tori.logs)."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    stages = logging.getLogger("tori.stage")
    handler, level, start = _LatestStage(what), stages.level, time.monotonic()
    stages.addHandler(handler)
    if stages.getEffectiveLevel() > logging.INFO:
        stages.setLevel(logging.INFO)
    done = threading.Event()

    def show() -> None:
        if done.wait(delay_s):
            return
        with console.status(what) as status:
            while not done.wait(0.1):
                status.update(f"{handler.latest}  [{time.monotonic() - start:.1f} s]")

    thread = threading.Thread(target=show, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stages.removeHandler(handler)
        stages.setLevel(level)


def _console(stderr: bool = False) -> Console:
    # Tables keep their width when piped into a file or another program.
    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 160)


def _options(target: str | None, extra: tuple[str, ...]) -> dict[str, Any]:
    """tori options from --target and each --option KEY=VALUE, checked before any work."""
    from tori.config import Options

    options: dict[str, Any] = {}
    if target:
        options["target"] = target
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        options[key.strip()] = value
    Options.from_mapping(options)
    return options


def _writable(path: Path | None, option: str, *, folder: bool = False) -> None:
    """A usage error, before any work, where `path` (a file, or with `folder` a folder
    written or replaced) cannot be written."""
    if path is None:
        return
    path = Path(path)
    existing = next(p for p in [path, *path.parents] if p.exists())
    if existing == path:
        if path.is_dir() and not folder:
            raise click.BadParameter(f"{path} is a folder; give a file path", param_hint=option)
        if not path.is_dir() and folder:
            raise click.BadParameter(f"{path} is a file; give a folder path", param_hint=option)
        if not os.access(path, os.W_OK):
            raise click.BadParameter(f"{path} is not writable", param_hint=option)
    elif not existing.is_dir() or not os.access(existing, os.W_OK):
        raise click.BadParameter(f"cannot create {path}: {existing} is not a writable folder", param_hint=option)


# ---------------------------------------------------------------------------
# tori opt


@subcommand("opt")
@click.argument("file", type=click.Path(path_type=Path, allow_dash=True), required=False)
@click.option("--pipeline", "-p", default="", help="MLIR-syntax pipeline of tori and upstream passes.")
@click.option("--print-ir-after-change", is_flag=True, help="Print the IR after each pass that changed it (stderr).")
@click.option("--timing", is_flag=True, help="Print each pass's time (stderr).")
@click.option("--list-passes", is_flag=True, help="List every pass a pipeline can name, one line each.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result here instead of stdout.")
def opt(file: Path | None, pipeline: str, print_ir_after_change: bool, timing: bool, list_passes: bool,
        output: Path | None) -> None:
    """Run a pass pipeline over FILE (MLIR text; - reads stdin), like mlir-opt with tori's passes."""
    from tori.frontend.importer import new_context
    from tori.passes import run_pipeline, validate_pipeline
    from tori.tools.mlir_file import parse_mlir_file, parse_mlir_text

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
        raise click.UsageError("FILE is required (- reads stdin), or --list-passes")
    _writable(output, "--output")
    validate_pipeline(pipeline)
    context = new_context()
    module = parse_mlir_file(file, context) if str(file) != "-" else parse_mlir_text(sys.stdin.read(), context)
    if str(file) == "-":
        file = Path("stdin")

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
    options = _options(target, extra)
    module, inputs = load_model(model)
    with progress(f"exploring {model}"):
        outcomes = explore(module, inputs, variant_list, seconds=seconds, options=options)
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
# tori profile

@subcommand("profile")
@click.argument("model")
@click.option("--calls", default=20, show_default=True, help="Calls profiled per graph.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the profile as JSON here.")
@click.option("--trace", type=click.Path(path_type=Path), help="Write a Perfetto trace (.pftrace) here.")
@click.option("--top", default=25, show_default=True, help="Dispatches shown in the table.")
@click.option("--target", default=None, help="IREE target (tori.Target).")
@click.option("--option", "extra", multiple=True, help="Any other tori option, KEY=VALUE.")
def profile_command(model: str, calls: int, json_path: Path | None, trace: Path | None, top: int,
                    target: str | None, extra: tuple[str, ...]) -> None:
    """Compile MODEL (MODULE:FACTORY returning (model, inputs)) in inference and show
    where a call's time goes, per IREE dispatch (IREE's HAL profiler)."""
    import torch

    from tori.tools.loading import load_model
    from tori.tools.profile import profile

    options = _options(target, extra)
    for path in (json_path, trace):
        _writable(path, "--json" if path is json_path else "--trace")
    module, inputs = load_model(model)
    with torch.no_grad(), progress(f"profiling {model}"):
        result = profile(module, *inputs, calls=calls, options=options, trace=trace)
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=1))
    table = Table(title=f"tori profile {model}: {result.wall_us_per_call:.0f} us per call "
                        f"({result.dispatch_us_per_call:.0f} us in {len(result.dispatches)} dispatches); "
                        f"fp32 GEMM peak {result.peak_gflops:.0f} GFLOP/s (torch.mm {result.torch_gemm_gflops:.0f}, "
                        f"IREE {result.iree_gemm_gflops:.0f})", title_justify="left")
    for column, justify in (("dispatch", "left"), ("us/call", "right"), ("share", "right"),
                            ("GFLOP/s (of peak)", "right"), ("torch ops", "left"), ("source", "left")):
        table.add_column(column, justify=justify)
    for row in result.table(top):
        table.add_row(*row)
    _console().print(table)
    if trace is not None:
        click.echo(f"trace written to {trace} (open it in ui.perfetto.dev)")


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
    _writable(output, "--output")
    module, inputs = load_model(model)
    seen = {r.name for r in compile_records()}
    with progress(f"compiling {model} for the report"):
        path, facts = report_model(module, inputs, output, options=options, name=model)
    records = [r for r in compile_records() if r.name not in seen and Path(r.options.report or "") == output]
    graphs = [g for r in records for g in r.graphs]
    click.echo(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    click.echo(f"  {len(records)} Dynamo graph(s), {len(facts.graph_breaks)} graph break(s), "
               f"{sum(g.compiled is not None for g in graphs)} of {len(graphs)} AOT graph(s) compiled"
               + (f", {sum(g.partitioned for g in graphs)} partitioned" if any(g.partitioned for g in graphs) else ""))
    for graph in graphs:
        status = graph.status
        passes = ", ".join(f"{r.step.name} {r.seconds * 1e3:.1f} ms" for r in graph.passes) or "no passes"
        click.echo(f"  {graph.name}: {status}; {passes}")
    for found in facts.graph_breaks:
        click.echo(f"  graph break at {found.where}: {found.reason.splitlines()[0]}")
    click.echo(f"  output vs eager: {'matches' if facts.correct else 'DIFFERS'} (max error {facts.max_error:.1e})")



# ---------------------------------------------------------------------------
# tori export / tori run


def _args_spec(specs: tuple[str, ...], inputs: tuple) -> tuple | None:
    """torch.export dynamic_shapes from one --args-spec per input: its dims, comma-separated,
    each a size (static, as in the example input) or NAME[:MIN..MAX] (dynamic)."""
    import torch

    if not specs:
        return None
    if len(specs) != len(inputs):
        raise click.BadParameter(f"{len(specs)} spec(s) for {len(inputs)} example input(s)", param_hint="--args-spec")
    dims: dict[str, Any] = {}
    shapes = []
    for index, (text, example) in enumerate(zip(specs, inputs)):
        items = [item.strip() for item in text.split(",")]
        if len(items) != example.dim():
            raise click.BadParameter(f"input {index}: {len(items)} dim(s) in {text!r}, the example input has "
                                     f"shape {list(example.shape)}", param_hint="--args-spec")
        shape = {}
        for axis, item in enumerate(items):
            if item.isdigit():
                if int(item) != example.shape[axis]:
                    raise click.BadParameter(f"input {index} dim {axis} is {example.shape[axis]} in the example, "
                                             f"not {item}", param_hint="--args-spec")
                continue
            label, low, high = _dynamic_dim(item, index, axis)
            if label not in dims:
                dims[label] = torch.export.Dim(label, min=low, max=high) if high is not None \
                    else torch.export.Dim(label, min=low)
            shape[axis] = dims[label]
        shapes.append(shape or None)
    return tuple(shapes)


def _dynamic_dim(item: str, index: int, axis: int) -> tuple[str, int, int | None]:
    """NAME, NAME:MIN.., NAME:..MAX or NAME:MIN..MAX: (name, min, max or None)."""
    label, colon, bounds = item.partition(":")
    low, dots, high = bounds.partition("..")
    where = f"input {index} dim {axis} ({item!r})"
    if not label.isidentifier() or (colon and not dots):
        raise click.BadParameter(f"{where}: a dim is a size or NAME[:MIN..MAX], e.g. batch or batch:1..64",
                                 param_hint="--args-spec")
    try:
        least = int(low) if low.strip() else 0
        most = int(high) if high.strip() else None
    except ValueError:
        raise click.BadParameter(f"{where}: MIN and MAX are integers, e.g. batch:1..64", param_hint="--args-spec") \
            from None
    if least < 0 or (most is not None and most < least):
        raise click.BadParameter(f"{where}: the range is empty or negative; write MIN..MAX with 0 <= MIN <= MAX",
                                 param_hint="--args-spec")
    return label, least, most


@subcommand("export")
@click.argument("model")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Artifact folder to write.")
@click.option("--target", "targets", default="cpu", show_default=True, help="Targets, comma-separated (cpu,vulkan).")
@click.option("--args-spec", "args_spec", multiple=True,
              help="Dims of one input (repeat per input): sizes or NAME[:MIN..MAX], e.g. 'batch:1..64,256'.")
@click.option("--external-weights", is_flag=True, help="Weights in parameters.irpa, loaded at run time.")
@click.option("--c-embed", is_flag=True, help="Also write C sources embedding each module (iree-c-embed-data).")
@click.option("--pipeline", "-p", default=None, help="tori pipeline (default: the configured one).")
@click.option("--option", "extra", multiple=True, help="Any other tori option, KEY=VALUE.")
def export_command(model: str, output: Path, targets: str, args_spec: tuple[str, ...], external_weights: bool,
                   c_embed: bool, pipeline: str | None, extra: tuple[str, ...]) -> None:
    """Export MODEL (MODULE:FACTORY returning (model, inputs)) to an artifact folder (docs/export.md)."""
    from tori.aot.export import export
    from tori.runtime.artifact import read_manifest
    from tori.tools.loading import load_model

    options = _options(None, extra)
    if pipeline is not None:
        options["pipeline"] = pipeline
    _writable(output, "--output", folder=True)
    module, inputs = load_model(model)
    dynamic_shapes = _args_spec(args_spec, inputs)
    with progress(f"exporting {model}"):
        path = export(module, inputs, dynamic_shapes=dynamic_shapes, targets=targets, output_dir=output,
                      external_weights=external_weights, options=options, c_embed=c_embed)
    manifest = read_manifest(path)
    click.echo(f"wrote {path}")
    for name, info in manifest["files"].items():
        click.echo(f"  {name}  {info['bytes']} bytes")
    for name, entry in manifest["entry_points"].items():
        inputs_text = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in entry["inputs"])
        outputs_text = ", ".join(f"{o['dtype']}{o['shape']}" for o in entry["outputs"])
        click.echo(f"  {name}({inputs_text}) -> {outputs_text}  [{entry['tracer']}]")


@subcommand("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, type=click.Path(path_type=Path), help="An input .npy (in order).")
@click.option("--entry", default=None, help="Entry point (default: the only one, or forward).")
@click.option("--device", default="cpu", show_default=True, help="A target of the artifact or an IREE driver.")
@click.option("--examples", is_flag=True, help="Run on the example inputs saved at export; compare with eager's outputs.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Write outputs as .npy files here.")
def run_command(artifact: Path, inputs: tuple[Path, ...], entry: str | None, device: str, examples: bool,
                output: Path | None) -> None:
    """Run an exported ARTIFACT folder on .npy inputs; print the outputs or write .npy files.
    Needs only IREE's runtime and numpy."""
    import numpy as np

    from tori.runtime.artifact import load

    _writable(output, "--output", folder=True)
    loaded = load(artifact, device=device)
    names = list(loaded.entry_points)
    if entry is None and len(names) > 1 and "forward" not in names:
        raise click.UsageError(f"{artifact} has entry points {', '.join(names)}: choose one with --entry NAME")
    entry = entry or (names[0] if len(names) == 1 else "forward")
    function = loaded[entry]
    if examples:
        files = function.spec.get("examples") or {}
        if not files:
            raise click.UsageError(f"the artifact has no examples for '{entry}' (exported with examples=False)")
        inputs = tuple(artifact / f for f in files["inputs"])
    values = [_npy(path) for path in inputs]
    start = time.perf_counter()
    results = function(*values)
    logging.getLogger("tori.run").info("%s(%s) ran in %.2f ms", entry, ", ".join(
        f"{v.dtype}{list(v.shape)}" for v in values), (time.perf_counter() - start) * 1e3)
    results = results if isinstance(results, tuple) else (results,)
    worst = 0.0
    for index, (name, value) in enumerate(zip(function.output_names, results)):
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
            np.save(output / f"{name}.npy", value)
            click.echo(f"{name}: {value.dtype}{list(value.shape)} -> {output / f'{name}.npy'}")
        else:
            click.echo(f"{name}: {value.dtype}{list(value.shape)}")
            click.echo(np.array2string(value, threshold=64))
        if examples:
            expected = np.load(artifact / files["outputs"][index])
            worst = max(worst, float(np.max(np.abs(value.astype(np.float64) - expected))) if value.size else 0.0)
    if examples:
        click.echo(f"max abs difference vs eager (saved at export): {worst:.3e}")


def _npy(path: Path):
    """One input array from a .npy file (numpy.save writes one)."""
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except ValueError as error:
        raise click.BadParameter(f"{path} is not a .npy array file; write one with numpy: np.save('x.npy', array)",
                                 param_hint="--input") from None


if __name__ == "__main__":
    main()
