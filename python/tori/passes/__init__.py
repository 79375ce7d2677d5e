"""The `tori` stage: tori's pass registry and textual pipelines.

A pass is one function in its own module under passes/, registered by name with
`@register_pass`; a pipeline is a comma-separated list of names. Names that are
not tori passes are handed to MLIR's own pass parser (e.g. `canonicalize`, `cse`),
so tori and upstream passes mix in one pipeline run by MLIR's PassManager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from tori.config import DEFAULT_PIPELINE  # noqa: F401  (re-exported beside the registry)
from tori.errors import CompileError, OptionsError
from tori.stages import Stage

PassFn = Callable[[ir.Operation, object], None]


@dataclass(frozen=True)
class RegisteredPass:
    name: str
    run: PassFn
    description: str


_REGISTRY: dict[str, RegisteredPass] = {}


def register_pass(name: str) -> Callable[[PassFn], PassFn]:
    def decorate(fn: PassFn) -> PassFn:
        if name in _REGISTRY:
            raise ValueError(f"tori pass '{name}' is registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = RegisteredPass(name, fn, doc[0] if doc else "")
        return fn

    return decorate


def registered_passes() -> dict[str, RegisteredPass]:
    return dict(_REGISTRY)


def parse_pipeline(pipeline: str) -> list[str]:
    return [name.strip() for name in pipeline.split(",") if name.strip()]


def _add_pass(manager: PassManager, name: str) -> None:
    registered = _REGISTRY.get(name)
    if registered is not None:
        manager.add(registered.run, name=name, argument=name, description=registered.description)
        return
    try:
        manager.add(name)
    except ValueError:
        raise OptionsError("pass", name, sorted(_REGISTRY) + ["<any MLIR pass, e.g. canonicalize, cse>"]) from None


def validate_pipeline(pipeline: str) -> str:
    """Raise OptionsError naming the first pass in `pipeline` that does not exist."""
    from tori.frontend.importer import new_context

    with new_context():
        manager = PassManager("builtin.module")
        for name in parse_pipeline(pipeline):
            _add_pass(manager, name)
    return pipeline


class PassError(CompileError):
    """A pass failed or left IR that does not verify; `ir_before` is its input."""

    def __init__(self, message: str, *, pass_name: str, ir_before: str, graph: str = ""):
        self.pass_name = pass_name
        self.ir_before = ir_before
        super().__init__(message, stage=Stage.TORI.value, graph=graph, op=f"pass {pass_name}")


def run_pipeline(module: ir.Module, pipeline: str, *, graph: str = "") -> None:
    """Run a textual tori pipeline over `module` in place, one pass at a time.

    MLIR's verifier runs after every pass, so invalid IR stops at the pass that made
    it, never reaches IREE, and the error carries the IR that pass was given.
    """
    with module.context:
        for name in parse_pipeline(pipeline):
            manager = PassManager("builtin.module")
            _add_pass(manager, name)
            ir_before = str(module)
            try:
                manager.run(module.operation)
            except Exception as error:
                raise PassError(f"pass '{name}' failed or produced invalid IR: {error}",
                                pass_name=name, ir_before=ir_before, graph=graph) from error


# Each pass module registers itself on import; imported last, after the registry exists.
from tori.passes import fold_constants  # noqa: E402,F401
