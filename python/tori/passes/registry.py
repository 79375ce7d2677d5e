"""tori's pass registry and MLIR-syntax textual pipelines.

A tori pass is one function in its own module under passes/, registered by name
with `@register_pass`. A pipeline is written in MLIR's textual syntax and may mix
tori passes with every pass MLIR's and Torch-MLIR's bindings register:

    builtin.module(func.func(tori-fold-constants, canonicalize), cse)
    tori-fold-constants, canonicalize{max-iterations=2}

A bare list runs on the module. Op anchors (`func.func(...)`) nest as in
`mlir-opt`; a tori pass under an anchor runs once on every op of that name.
Options in braces go to upstream passes as MLIR parses them and to tori passes as
keyword arguments (`tori-fold-constants{limit=4096}`), converted to the type of the
parameter's default.

Each pass runs on its own under MLIR's verifier, so a pass that fails or leaves
invalid IR stops the compile with a `PassError` naming it and holding its input IR.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from tori.config import DEFAULT_PIPELINE
from tori.errors import CompileError, OptionsError
from tori.stages import Stage

PassFn = Callable[..., None]
ROOT = "builtin.module"

__all__ = ["DEFAULT_PIPELINE", "PassError", "PassStep", "RegisteredPass", "parse_pipeline",
           "register_pass", "registered_passes", "run_pipeline", "validate_pipeline"]


@dataclass(frozen=True)
class RegisteredPass:
    name: str
    run: PassFn
    description: str
    options: dict[str, Any]  # option name (as written in a pipeline) -> default value

    def bind(self, options: dict[str, str]) -> dict[str, Any]:
        """Keyword arguments for `run` from a pipeline's `{key=value}` options."""
        bound = {}
        for key, text in options.items():
            if key not in self.options:
                valid = sorted(self.options)
                raise OptionsError("pass option", key, valid, message=(
                    f"pass {self.name} has no option {key!r}; its options: {', '.join(valid) or 'none'}"))
            default = self.options[key]
            try:
                bound[key.replace("-", "_")] = _convert(text, type(default))
            except ValueError:
                kind = _KINDS.get(type(default), f"a {type(default).__name__}")
                raise OptionsError("pass option value", text, [kind], message=(
                    f"option {key} of pass {self.name} takes {kind}, not {text!r}")) from None
        return bound


# How an option's type reads in an error: "takes an integer, not 'x'".
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}

_REGISTRY: dict[str, RegisteredPass] = {}


def register_pass(name: str) -> Callable[[PassFn], PassFn]:
    """Register `fn(op, pass_, **options)` as the tori pass `name`.

    `op` is the operation the pass runs on (the module, or each op of a pipeline's
    anchor); `pass_` is MLIR's ExternalPass (`pass_.signal_pass_failure()`). Keyword
    parameters with defaults are the pass's options; the first docstring line is its
    description in `--list-passes`.
    """

    def decorate(fn: PassFn) -> PassFn:
        if name in _REGISTRY:
            raise ValueError(f"tori pass '{name}' is registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        options = {p.name.replace("_", "-"): p.default for p in inspect.signature(fn).parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}
        _REGISTRY[name] = RegisteredPass(name, fn, doc[0] if doc else "", options)
        return fn

    return decorate


def registered_passes() -> dict[str, RegisteredPass]:
    return dict(_REGISTRY)


def _convert(text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    return kind(text)


# ---------------------------------------------------------------------------
# Parsing MLIR's pipeline syntax


@dataclass(frozen=True)
class PassStep:
    """One pass of a pipeline: its name, options and the op anchors it nests under."""

    name: str
    anchors: tuple[str, ...] = (ROOT,)
    options: dict[str, str] = field(default_factory=dict)
    options_text: str = ""

    def text(self, *, with_root: bool = False) -> str:
        """This step alone in MLIR's syntax: `func.func(cse)`, or with the module
        anchor written out, `builtin.module(func.func(cse))`."""
        body = self.name + (f"{{{self.options_text}}}" if self.options_text else "")
        for anchor in reversed(self.anchors if with_root else self.anchors[1:]):
            body = f"{anchor}({body})"
        return body


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, message: str) -> OptionsError:
        pointer = f"{self.text}\n{' ' * self.pos}^"
        return OptionsError("pipeline", self.text, ["MLIR pass pipeline syntax"], message=(
            f"invalid pipeline: {message} at column {self.pos}:\n{pointer}\n"
            "expected MLIR's syntax, e.g. builtin.module(func.func(tori-fold-constants, canonicalize), cse)"))

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name(self) -> str:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] in "-_."):
            self.pos += 1
        if start == self.pos:
            raise self.error("expected a pass or op name")
        return self.text[start:self.pos]

    def braces(self) -> str:
        """The text between matching braces (the opening one is next), quotes respected."""
        depth, start, quote = 0, self.pos + 1, None
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if quote:
                quote = None if char == quote else quote
            elif char in "\"'":
                quote = char
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    self.pos += 1
                    return self.text[start:self.pos - 1].strip()
            self.pos += 1
        raise self.error("unclosed '{'")

    def elements(self, anchors: tuple[str, ...], closing: str) -> list[PassStep]:
        steps: list[PassStep] = []
        while True:
            if self.peek() == closing:
                break
            name = self.name()
            if self.peek() == "(":
                self.pos += 1
                steps.extend(self.elements(anchors + (name,), ")"))
                if self.peek() != ")":
                    raise self.error("expected ')'")
                self.pos += 1
            else:
                options_text = self.braces() if self.peek() == "{" else ""
                steps.append(PassStep(name, anchors, _split_options(options_text), options_text))
            if self.peek() != ",":
                break
            self.pos += 1
        return steps


def _split_options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in _top_level_split(text):
        key, _, value = item.partition("=")
        options[key.strip()] = value.strip().strip("\"'")
    return options


def _top_level_split(text: str) -> list[str]:
    """`text` split at spaces outside braces and quotes."""
    items, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "{[(":
            depth += 1
        elif char in "}])":
            depth -= 1
        elif char.isspace() and depth == 0:
            if current:
                items.append(current)
            current = ""
            continue
        current += char
    if current:
        items.append(current)
    return items


def parse_pipeline(pipeline: str) -> list[PassStep]:
    """The passes of a textual pipeline in the order they run.

    `builtin.module(a, func.func(b))` and the bare `a, func.func(b)` are the same
    pipeline; an anchor other than the module nests under it.
    """
    parser = _Parser(pipeline)
    steps = parser.elements((), "")
    if parser.peek():
        raise parser.error("unexpected text")
    return [step if step.anchors[:1] == (ROOT,) else
            PassStep(step.name, (ROOT,) + step.anchors, step.options, step.options_text) for step in steps]


# ---------------------------------------------------------------------------
# Running


def _anchored(op: ir.Operation, anchors: tuple[str, ...]):
    """The ops nested under `op` (an op named anchors[0]) along the anchor path."""
    if len(anchors) == 1:
        yield op
        return
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                if child.operation.name == anchors[1]:
                    yield from _anchored(child.operation, anchors[1:])


def _manager(step: PassStep) -> PassManager:
    registered = _REGISTRY.get(step.name)
    if registered is None:
        try:
            return PassManager.parse(step.text(with_root=True))
        except ValueError as error:
            lines = str(error).strip().splitlines()
            mlir_says = next((line.split("error: ", 1)[1] for line in lines if "error: " in line), lines[0] if lines else "")
            closest = "" if step.options_text else _closest(step.name)
            raise OptionsError("pass", step.text(), sorted(_REGISTRY), message=(
                (f"pass {step.name} rejects the options in {step.text()!r}" if step.options_text
                 else f"unknown pass {step.name!r} (in {step.text()!r})")
                + f": MLIR says: {mlir_says}; " + closest +
                f"tori's passes: {', '.join(sorted(_REGISTRY))}; any pass MLIR's or Torch-MLIR's "
                "bindings register also works (e.g. canonicalize, cse, torch-reduce-op-variants)")) from None
    kwargs = registered.bind(step.options)

    def run(module: ir.Operation, pass_: object) -> None:
        for op in list(_anchored(module, step.anchors)):
            registered.run(op, pass_, **kwargs)

    manager = PassManager(ROOT)
    manager.add(run, name=step.name, argument=step.name, description=registered.description)
    return manager


def _closest(name: str) -> str:
    from tori.passes.catalog import closest_passes

    close = closest_passes(name)
    return f"closest registered names: {', '.join(close)}; " if close else ""


def validate_pipeline(pipeline: str) -> str:
    """Raise OptionsError naming the first pass in `pipeline` that does not exist,
    has an unknown option, or is written in invalid syntax."""
    from tori.frontend.importer import new_context

    with new_context():
        for step in parse_pipeline(pipeline):
            _manager(step)
    return pipeline


class PassError(CompileError):
    """A pass failed or left IR that does not verify; `ir_before` is its input."""

    def __init__(self, message: str, *, pass_name: str, ir_before: str, graph: str = "",
                 step: str = ""):
        self.pass_name = pass_name
        self.step = step or pass_name  # the pass as a one-step pipeline, anchors and options kept
        self.ir_before = ir_before
        super().__init__(message, stage=Stage.TORI.value, graph=graph, op=f"pass {pass_name}")


@dataclass
class PassRun:
    """What one pass did to a module: its time and whether it changed the IR."""

    step: PassStep
    seconds: float
    changed: bool
    ir_after: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        ir = f", ir_after: {len(self.ir_after.splitlines())} lines" if self.ir_after is not None else ""
        return f"PassRun({self.step.text()}, {self.seconds * 1e3:.2f} ms, changed={self.changed}{ir})"


def run_pipeline(module: ir.Module, pipeline: str, *, graph: str = "",
                 on_pass: Callable[[PassRun], None] | None = None, text: str | None = None) -> list[PassRun]:
    """Run a textual pipeline over `module` in place, one pass at a time.

    MLIR's verifier runs after every pass, so invalid IR stops at the pass that made
    it, never reaches IREE, and the error carries the IR that pass was given.
    Returns what each pass did; `on_pass` sees each as it finishes. `text` is the
    module as `str(module)` prints it, where the caller has it: the module is printed
    once per pass (a pass's result is the next one's input; ResNet-50's module takes
    16 ms to print).
    """
    import time

    runs: list[PassRun] = []
    ir_before = text
    with module.context:
        for step in parse_pipeline(pipeline):
            manager = _manager(step)
            if ir_before is None:
                ir_before = str(module)
            start = time.perf_counter()
            try:
                manager.run(module.operation)
            except Exception as error:
                raise PassError(f"pass '{step.name}' failed or produced invalid IR: {error}",
                                pass_name=step.name, ir_before=ir_before, graph=graph,
                                step=step.text()) from error
            ir_after = str(module)
            done = PassRun(step, time.perf_counter() - start, ir_after != ir_before, ir_after)
            runs.append(done)
            if on_pass is not None:
                on_pass(done)
            ir_before = ir_after
    return runs
