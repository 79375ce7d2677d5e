"""The one exception hierarchy of tori.

Every error says what failed, where (stage, op, MLIR location) and what the
user can do next; compile errors also point at a repro file.
"""

from __future__ import annotations

from pathlib import Path


class ToriError(Exception):
    """Base class of every error tori raises."""


class OptionsError(ToriError, ValueError):
    """An option, target, stance or environment variable has an invalid value."""

    def __init__(self, what: str, value: object, valid: list[str] | tuple[str, ...], hint: str = "",
                 *, message: str | None = None):
        self.what = what
        self.value = value
        self.valid = tuple(valid)
        if message is None:
            message = f"unknown {what} {value!r}; valid {what}s: {', '.join(self.valid)}"
        if hint:
            message += f". {hint}"
        super().__init__(message)


class CompileError(ToriError):
    """A graph could not be compiled at some stage of the pipeline."""

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        graph: str = "",
        op: str | None = None,
        location: str | None = None,
        repro: Path | None = None,
        command: str | None = None,
    ):
        self.reason = message
        self.stage = stage
        self.graph = graph
        self.op = op
        self.location = location
        self.repro = repro
        self.command = command
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"stage '{self.stage}'"
        if self.graph:
            where += f", graph '{self.graph}'"
        if self.op:
            where += f", op {self.op}"
        if self.location:
            where += f", at {self.location}"
        lines = [f"tori could not compile ({where}): {self.reason}"]
        if self.repro is not None:
            lines.append(f"  failing input written to: {self.repro}")
        if self.command:
            lines.append(f"  reproduce with: {self.command}")
        lines.append(
            "  what to do: run with options={'fallback': 'eager'} to run this graph in "
            "eager PyTorch, or report the repro file."
        )
        return "\n".join(lines)

    def with_repro(self, repro: Path, command: str) -> "CompileError":
        self.repro = repro
        self.command = command
        self.args = (self._render(),)
        return self


class UnsupportedOpError(CompileError):
    """An op has no lowering in Torch-MLIR or IREE."""


class ToriRuntimeError(ToriError, RuntimeError):
    """A compiled module failed while running, or could not be loaded."""


class CheckFailedError(ToriRuntimeError):
    """A check compiled into a module failed on these inputs, where eager raises too
    (frontend/decomp/checks.py: integer division by zero, with eager's message
    "ZeroDivisionError"). Raised with any fallback: eager would fail the same way."""


class IndexOutOfBoundsError(CheckFailedError):
    """An index was out of range for its op, where eager raises a RuntimeError
    (gather, scatter, index_add)."""


class IndexOutOfRangeError(IndexOutOfBoundsError, IndexError):
    """An index was out of range for an op where eager raises IndexError (indexing,
    index_put, index_select, embedding)."""


# How the messages of the checks tori compiles into modules begin, and the error
# raised when one fails (a linalg error check, or the user's own torch._assert_async,
# is none of these: that call falls back to eager, which raises its own error).
INDEX_ERROR_CHECK = "index out of range"
INDEX_RUNTIME_CHECK = "index out of bounds"
ZERO_DIVISION_CHECK = "ZeroDivisionError"
_CHECK_ERRORS = {INDEX_ERROR_CHECK: IndexOutOfRangeError, INDEX_RUNTIME_CHECK: IndexOutOfBoundsError,
                 ZERO_DIVISION_CHECK: CheckFailedError}


def runtime_check_error(message: str) -> type[ToriRuntimeError]:
    """The error class for a failed runtime check (`torch.runtime.assert`) with this message."""
    return next((cls for prefix, cls in _CHECK_ERRORS.items() if message.startswith(prefix)), ToriRuntimeError)


_DYNAMO_CLASSES: dict[type, type] = {}


def through_dynamo(error: ToriError) -> ToriError:
    """The same error, as an instance Dynamo lets through unwrapped.

    Dynamo wraps backend exceptions in BackendCompilerFailed unless they already
    are one; a subclass of both keeps `except tori.errors.CompileError` working
    (or `except tori.errors.OptionsError`) working for users of
    `torch.compile(backend="tori")`.
    """
    from torch._dynamo.exc import BackendCompilerFailed

    cls = _DYNAMO_CLASSES.get(type(error))
    if cls is None:
        cls = type(type(error).__name__, (type(error), BackendCompilerFailed), {"__module__": __name__})
        _DYNAMO_CLASSES[type(error)] = cls
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(error.__dict__)
    wrapped.args = error.args
    wrapped.backend_name = "tori"
    wrapped.inner_exception = error
    wrapped.first_useful_frame = None
    wrapped.__cause__ = error.__cause__
    return wrapped


class InputError(ToriError, ValueError):
    """A file given to tori could not be read, e.g. MLIR that does not parse."""


class ArtifactError(ToriError, ValueError):
    """An exported artifact is missing, damaged, of a newer format, or was given
    inputs its manifest does not allow; names the file and the manifest field."""

    def __init__(self, message: str, *, path: object = None, field: str | None = None):
        self.path = path
        self.field = field
        where = []
        if path is not None:
            where.append(str(path))
        if field:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")
