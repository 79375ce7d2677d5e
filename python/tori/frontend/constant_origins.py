"""Where the constants of `torch.compiler.assume_constant_result` come from: the
function Dynamo called and the line that called it, carried to the `tori` stage as
`tori.assumed_constant` ops on the literals.

Dynamo calls such a function while tracing and puts its value on the graph module
as an attribute named after the function (`table`, `table_0`, ...), read by a
`get_attr` node whose stack trace is the call site. The backend turns these into
literals of the AOT graph (frontend/backend.py), with their `AssumedConstant` in the
node's meta under ORIGIN; the importer wraps each such literal in the origin op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.fx
from torch_mlir import ir

from tori.dialects import tori as tori_dialect

ORIGIN = "tori_assumed_constant"  # node meta key of an AssumedConstant

_FRAME_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_UNIQUE_SUFFIX = re.compile(r"_\d+$")
_CALLED = re.compile(r"(\w+)\s*\(")


@dataclass(frozen=True)
class AssumedConstant:
    """One value of an `assume_constant_result` function in a Dynamo graph."""

    tensor: torch.Tensor
    function: str  # qualified name, e.g. "model.Net.scale"; the bare name when unresolved
    source: str  # "file:line" of the call, or ""


def assumed_constants(gm: torch.fx.GraphModule, names: list[str]) -> list[AssumedConstant]:
    """The AssumedConstant of each buffer `names` of a Dynamo graph module."""
    reads = {node.target: node for node in gm.graph.find_nodes(op="get_attr")}
    found = []
    for name in names:
        node = reads.get(name)
        found.append(AssumedConstant(getattr(gm, name), _function_name(name, node), _call_site(node)))
    return found


def _call_site(node: torch.fx.Node | None) -> str:
    trace = (node.meta.get("stack_trace") or "") if node is not None else ""
    frames = _FRAME_LINE.findall(trace)
    if not frames:
        return ""
    path, line, _ = frames[-1]
    return f"{path}:{line}"


def _function_name(attribute: str, node: torch.fx.Node | None) -> str:
    """The qualified name of the function whose value Dynamo stored as `attribute`.

    Dynamo names the attribute after the function's `__name__`, with a suffix when
    the name is taken; the function itself is found among the traced frame's globals
    and the attributes of its locals' classes (for methods). Dynamo also folds
    arithmetic on such values into new attributes named after the op (`mul`): those
    are attributed to the marked functions called on the line that made them.
    """
    scopes = _frame_scopes()
    for name in (attribute, _UNIQUE_SUFFIX.sub("", attribute)):
        found = _marked(scopes, name)
        if found:
            return found
    trace = (node.meta.get("stack_trace") or "") if node is not None else ""
    code = "\n".join(line for line in trace.splitlines() if not line.strip().startswith("File "))
    called = sorted({found for name in _CALLED.findall(code) if (found := _marked(scopes, name))})
    return ", ".join(called) if called else _UNIQUE_SUFFIX.sub("", attribute)


def _marked(scopes, name: str) -> str | None:
    """The qualified name of the `assume_constant_result` function `name`, if in scope."""
    for scope in scopes:
        function = scope(name)
        if callable(function) and getattr(function, "_dynamo_marked_constant", False):
            module = getattr(function, "__module__", None)
            qualname = getattr(function, "__qualname__", name)
            return f"{module}.{qualname}" if module else qualname
    return None


def _frame_scopes():
    """Lookups by name in the frame Dynamo is tracing: its globals, then the classes
    of its locals (where methods are found)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not inside Dynamo's tracing: names stay unresolved
        return []
    if tx is None:
        return []
    scopes = [lambda name: tx.f_globals.get(name)]
    for value in list(getattr(tx, "f_locals", {}).values()):
        scopes.append(lambda name, cls=type(value): getattr(cls, name, None))
    return scopes


def wrap_literal(node: torch.fx.Node, value: ir.Value) -> ir.Value:
    """`value` (the imported literal of `node`) through its origin op, when `node`
    reads an assumed constant; at the current insertion point."""
    origin = node.meta.get(ORIGIN)
    if origin is None or not isinstance(value, ir.Value):
        return value
    return tori_dialect.assumed_constant(value, origin.function, origin.source)
