"""One Python module lookup per MLIR dialect, not one per op.

MLIR's Python bindings look up a Python module for an op's dialect whenever they hand
the op to Python (iterating a block makes an OpView of each op), and remember only the
dialects they found one for: every op of a dialect without one (IREE's `util`, `flow`
and `hal`, Torch-MLIR's `torch_c`, tori's own) went through Python's import machinery
again, 25 us an op against 0.3, a third of tori's lowering passes' time on a CNN
(docs/performance.md, "CPU executables compiled in groups"). `install` adds a last
search prefix under which every dialect has a module, empty: such a dialect is looked
up once, and its ops stay plain OpViews as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

PREFIX = "tori._no_python_dialect"


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name.startswith(PREFIX + ".") else None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        pass


def install() -> None:
    """Register the prefix with the bindings' process-wide dialect search (once)."""
    if PREFIX in sys.modules:
        return
    from torch_mlir._mlir_libs import _mlir

    package = types.ModuleType(PREFIX)
    package.__path__ = []
    sys.modules[PREFIX] = package
    sys.meta_path.append(_EmptyModules())
    _mlir.globals.append_dialect_search_prefix(PREFIX)
