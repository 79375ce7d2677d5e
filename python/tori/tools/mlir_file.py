"""Reading an MLIR file for `tori opt`: a parse error names the file, line and column
and shows the line with a caret under the column."""

from __future__ import annotations

import re
from pathlib import Path

from torch_mlir import ir

from tori.errors import InputError

_LOCATION = re.compile(r'loc\("(?P<file>[^"]*)":(?P<line>\d+):(?P<column>\d+)\)')


def parse_mlir_file(path: Path, context: ir.Context) -> ir.Module:
    if not path.is_file():
        raise InputError(f"no such MLIR file: {path}")
    try:
        return ir.Module.parseFile(str(path), context=context)
    except ir.MLIRError as error:
        _raise_located(error, path, path.read_text(errors="replace"))


def parse_mlir_text(text: str, context: ir.Context, name: str = "<stdin>") -> ir.Module:
    """MLIR read from a stream (`tori opt -`); errors name `name`, line and column."""
    try:
        return ir.Module.parse(text, context=context)
    except ir.MLIRError as error:
        _raise_located(error, Path(name), text)


def _raise_located(error: "ir.MLIRError", path: Path, text: str) -> None:
    """An InputError naming the file, line and column, with a caret under the column."""
    diagnostic = error.error_diagnostics[0] if error.error_diagnostics else None
    where = _LOCATION.search(str(diagnostic.location)) if diagnostic is not None else None
    if where is None:
        raise InputError(f"{path} does not parse as MLIR: {error}") from None
    line, column = int(where["line"]), int(where["column"])
    lines = text.splitlines()
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    raise InputError(f"{path}:{line}:{column}: {diagnostic.message}\n{source}\n"
                     f"{' ' * (column - 1)}^") from None
