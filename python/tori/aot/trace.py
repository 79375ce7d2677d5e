"""The `aten` stage of tori.export: one entry point of a model traced by torch.export
into an ExportedProgram, with `assume_constant_result` functions evaluated at export
time, then decomposed as tori's backend decomposes.

Non-strict torch.export traces through a call of an `assume_constant_result` function
(only Dynamo replaces it by its value). tori runs the entry point once eagerly,
recording each marked function's results, and replays them while torch.export
traces: they become lifted constants, which reach the `torch` stage as literals.
Where non-strict tracing fails, torch.export's strict mode (Dynamo, which folds
marked functions itself) is tried; which one traced is recorded.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from tori.errors import CompileError
from tori.stages import Stage

log = logging.getLogger("tori.export")

NON_STRICT = "torch.export (non-strict)"
STRICT = "torch.export (strict: Dynamo)"

WRAPPED = "inner."  # prefix of the state names of a model wrapped to export one of its methods


class _Method(nn.Module):
    """A module whose forward is one method of a model (or any callable): what
    torch.export can trace for an entry point other than `forward`."""

    def __init__(self, model: Any, method: Callable):
        super().__init__()
        if isinstance(model, nn.Module):
            self.inner = model
        self._method = method

    def forward(self, *args, **kwargs):
        return self._method(*args, **kwargs)


def traceable(model: Any, method: str | Callable) -> tuple[nn.Module, str]:
    """The module torch.export traces for `method` of `model`, and the prefix of its state names."""
    if isinstance(model, nn.Module) and method == "forward":
        return model, ""
    function = getattr(model, method) if isinstance(method, str) else method
    if not callable(function):
        raise CompileError(f"entry point method {method!r} is not callable on {type(model).__name__}",
                           stage=Stage.DYNAMO.value)
    return _Method(model, function), WRAPPED if isinstance(model, nn.Module) else ""


@dataclass
class _Marked:
    """One `assume_constant_result` function: where it is bound, and its recorded values."""

    owner: Any  # a class or a module's globals dict
    name: str
    function: Callable
    values: list[Any] = field(default_factory=list)

    @property
    def qualified(self) -> str:
        module = getattr(self.function, "__module__", None)
        qualname = getattr(self.function, "__qualname__", self.name)
        return f"{module}.{qualname}" if module else qualname

    def bind(self, value: Callable) -> None:
        if isinstance(self.owner, dict):
            self.owner[self.name] = value
        else:
            setattr(self.owner, self.name, value)


def _is_marked(value: Any) -> bool:
    return callable(value) and getattr(value, "_dynamo_marked_constant", False)


def marked_functions(module: nn.Module, extra: Callable | None = None) -> list[_Marked]:
    """The `assume_constant_result` functions a model can call: methods of its modules'
    classes and functions in the globals of the code those classes (and `extra`) run."""
    found: dict[tuple[int, str], _Marked] = {}
    scopes: list[dict] = []
    for sub in module.modules():
        for cls in type(sub).__mro__:
            if cls in (nn.Module, object):
                continue
            for name, value in vars(cls).items():
                if _is_marked(value):
                    found.setdefault((id(cls), name), _Marked(cls, name, value))
                elif callable(value) and hasattr(value, "__globals__"):
                    scopes.append(value.__globals__)
    if extra is not None:
        function = getattr(extra, "__func__", extra)
        if hasattr(function, "__globals__"):
            scopes.append(function.__globals__)
    for scope in {id(s): s for s in scopes}.values():
        for name, value in list(scope.items()):
            if _is_marked(value):
                found.setdefault((id(scope), name), _Marked(scope, name, value))
    return list(found.values())


@contextlib.contextmanager
def _recording(marked: list[_Marked]):
    def recorder(entry: _Marked):
        def record(*args, **kwargs):
            value = entry.function(*args, **kwargs)
            entry.values.append(value)
            return value
        return record

    try:
        for entry in marked:
            entry.bind(recorder(entry))
        yield
    finally:
        for entry in marked:
            entry.bind(entry.function)


_UNSEEN = object()


@contextlib.contextmanager
def _replaying(marked: list[_Marked]):
    def replayer(entry: _Marked):
        calls = iter(list(entry.values))

        def replay(*args, **kwargs):
            # The n-th call gets the n-th eager value: the same Python code runs in both.
            value = next(calls, _UNSEEN)
            return entry.function(*args, **kwargs) if value is _UNSEEN else value
        return replay

    try:
        for entry in marked:
            entry.bind(replayer(entry))
        yield
    finally:
        for entry in marked:
            entry.bind(entry.function)


@dataclass
class Traced:
    program: torch.export.ExportedProgram
    tracer: str
    eager_outputs: Any
    prefix: str  # of the program's state names, stripped for parameter names
    constants: dict[int, _Marked]  # id of a recorded constant tensor -> its function


def trace(model: Any, method: str | Callable, args: tuple, kwargs: dict | None, dynamic_shapes: Any,
          *, name: str) -> Traced:
    """Run the entry point eagerly (the reference), then trace it with torch.export."""
    module, prefix = traceable(model, method)
    kwargs = dict(kwargs or {})
    marked = marked_functions(module, None if isinstance(method, str) else method)
    with torch.no_grad(), _recording(marked):
        eager = module(*args, **kwargs)
    errors = []
    for tracer, strict in ((NON_STRICT, False), (STRICT, True)):
        try:
            replay = _replaying(marked) if not strict else contextlib.nullcontext()
            with replay:
                program = torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes,
                                              strict=strict)
        except Exception as error:  # torch.export raises many kinds; each is reported below
            errors.append(f"{tracer}: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}")
            log.warning("tori.export: entry point '%s' could not be traced by %s (%s)%s", name, tracer,
                        errors[-1], "; trying Dynamo" if not strict else "")
            continue
        if errors:
            log.warning("tori.export: entry point '%s' traced by %s", name, tracer)
        constants = {id(v): entry for entry in marked for v in entry.values if isinstance(v, torch.Tensor)}
        return Traced(program, tracer, eager, prefix, constants)
    raise CompileError("torch.export could not trace it: " + "; ".join(errors), stage=Stage.DYNAMO.value,
                       graph=name)


def check_functional(program: torch.export.ExportedProgram, *, name: str) -> None:
    """Exported modules are functions: a program that updates buffers or inputs is refused."""
    signature = program.graph_signature
    mutated = list(signature.buffers_to_mutate.values()) + list(signature.user_inputs_to_mutate.values())
    if mutated:
        raise CompileError(
            f"it updates {', '.join(mutated)} in place, which an exported module cannot keep between calls; "
            "export the model in eval() mode, or return the new values instead", stage=Stage.ATEN.value, graph=name)
