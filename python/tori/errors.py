"""The one exception hierarchy of tori.

Every error says what failed, where (stage, op, MLIR location) and what the
user can do next; compile errors also point at a repro file.
"""

from __future__ import annotations

from pathlib import Path


class ToriError(Exception):
    """Base class of every error tori raises."""

    def __str__(self) -> str:
        # Dynamo appends its own advice ("Set TORCHDYNAMO_VERBOSE=1 ... reporting a bug to
        # PyTorch") to the message of an error raised through it; tori's message stands alone.
        return self.__dict__.get("_text") or super().__str__()


class OptionsError(ToriError, ValueError):
    """An option, target, stance or environment variable has an invalid value."""

    def __init__(self, what: str, value: object, valid: list[str] | tuple[str, ...], hint: str = "",
                 *, message: str | None = None, unknown: bool = False):
        """`valid` names the values there are (`unknown=True`: a name not among them) or
        describes the values expected ("a positive number of seconds")."""
        self.what = what
        self.value = value
        self.valid = tuple(valid)
        if message is None:
            if unknown:
                message = f"unknown {what} {value!r}; one of: {', '.join(self.valid)}"
            else:
                message = f"invalid {what} {value!r}; expected {' or '.join(self.valid)}"
        self.bare = message  # without the hint: a caller with a hint of its own (the CLI) uses it
        self.hint = hint
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
        hint: str | None = None,
    ):
        self.reason = message
        self.stage = stage
        self.graph = graph
        self.op = op
        self.location = location
        self.repro = repro
        self.command = command
        self.hint = hint
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
        hint = self._compile_hint() if self.hint is None else self.hint
        if hint:  # "" where the reason says what to do
            lines.append(f"  what to do: {hint}")
        return "\n".join(lines)

    def _compile_hint(self) -> str:
        hint = "run with options={'fallback': 'eager'} to run this graph in eager PyTorch"
        return hint + (", or report the repro file." if self.repro is not None else ".")

    def with_repro(self, repro: Path, command: str) -> "CompileError":
        self.repro = repro
        self.command = command
        self.args = (self._render(),)
        return self

    def with_hint(self, hint: str) -> "CompileError":
        """The same error with another 'what to do' (export has no eager fallback)."""
        self.hint = hint
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


def is_check_message(message: str) -> bool:
    """Whether an assert with this message is one of tori's own checks."""
    return runtime_check_error(message) is not ToriRuntimeError


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
    wrapped._text = str(error)
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
