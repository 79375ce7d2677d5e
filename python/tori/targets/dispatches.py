"""How many dispatches IREE makes of a torch-dialect module: iree-compile stopped
after dispatch formation (`--compile-to=flow`), its `flow.dispatch` ops counted.

A dispatch is one kernel launch per call, so the count is what fusion passes are
judged by, next to measured latency.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from torch_mlir import ir

from tori.config import Options
from tori.frontend.importer import to_bytecode
from tori.targets import Target
from tori.targets.iree_compile import IreeInvocation, run_iree_compile

# `flow.dispatch @executable::@entry(...)`, as IREE prints a dispatch in the flow phase.
_DISPATCH = re.compile(r"\bflow\.dispatch @([\w$.-]+)::@([\w$.-]+)")


@dataclass(frozen=True)
class Dispatches:
    """The dispatches of one module: entry point names in program order."""

    entries: tuple[str, ...]
    flow_ir: str

    @property
    def count(self) -> int:
        return len(self.entries)

    def by_kind(self) -> Counter:
        """Dispatches per kind, from IREE's entry names (`..._matmul_...`, `..._attention_...`)."""
        kinds: Counter = Counter()
        for entry in self.entries:
            # IREE names an entry `<func>_dispatch_<n>_<kind>_<shape>_<types>`.
            words = entry.split("::")[-1].rsplit("_dispatch_", 1)[-1].split("_")[1:]
            kinds[words[0] if words else entry] += 1
        return kinds


def flow_ir(module: ir.Module | bytes, *, target: Target = Target.CPU, options: Options | None = None,
            flags: tuple[str, ...] = (), timeout_s: float = 600.0) -> str:
    """The module after IREE's flow phase for `target`, as text: the flags are those
    torch.compile uses for it (`tori.targets.build.invocation`: the target's own
    architecture option from `options`, the user's `iree_flags`), then `flags`."""
    from tori.targets.build import invocation as build_invocation

    bytecode = module if isinstance(module, bytes) else to_bytecode(module)
    chosen = build_invocation(options or Options(), target, flags)
    flow = IreeInvocation((*chosen.flags, "--compile-to=flow"))
    return run_iree_compile(bytecode, flow, graph="dispatch-count", timeout_s=timeout_s).decode()


def count_dispatches(module: ir.Module | bytes, *, target: Target = Target.CPU, options: Options | None = None,
                     flags: tuple[str, ...] = (), timeout_s: float = 600.0) -> Dispatches:
    """The dispatches IREE forms for `module` (torch dialect, as an ir.Module or
    its bytecode) compiled for `target` as `options` say, with the extra `flags`."""
    return dispatches_of(flow_ir(module, target=target, options=options, flags=flags, timeout_s=timeout_s))


def recorded_flow_ir(graph, extra: tuple[str, ...] = (), timeout_s: float = 900.0) -> str | None:
    """The flow phase of a graph tori compiled, from the input and flags its compile
    recorded (`GraphRecord.iree_bytecode`, `.iree_invocation`: the code generation
    strategy's flags and resident weights included); None for a graph served from the
    cache."""
    if graph.iree_bytecode is None or graph.iree_invocation is None:
        return None
    flags = tuple(f for f in graph.iree_invocation.flags if not f.startswith("--dump-compilation-phases-to"))
    invocation = IreeInvocation((*flags, "--compile-to=flow", *extra))
    return run_iree_compile(graph.iree_bytecode, invocation, graph=f"{graph.name}-flow", timeout_s=timeout_s).decode()


def dispatches_of(text: str) -> Dispatches:
    return Dispatches(tuple(f"{m.group(1)}::{m.group(2)}" for m in _DISPATCH.finditer(text)), text)


def graph_dispatch_count(graph, options) -> int:
    """The dispatches of a compiled graph (a GraphRecord): as its compile formed them
    where it recorded its input, else from its `tori` stage compiled as `options` say."""
    from tori.frontend.importer import new_context
    from tori.passes.lower_dialect import lower_for_iree
    from tori.stages import Stage

    recorded = recorded_flow_ir(graph)
    if recorded is not None:
        return dispatches_of(recorded).count
    # Served from the cache: its `tori` stage, with the flags of its code generation.
    text = graph.stages[Stage.TORI]
    context = new_context()
    context.allow_unregistered_dialects = "util." in text  # IREE's ops (resident weights), parsed only as text there
    module = ir.Module.parse(text, context=context)
    lower_for_iree(module, options, codegen=graph.codegen)
    chosen = graph.codegen.flags_for(options.target) if graph.codegen is not None else ()
    source = str(module).encode() if context.allow_unregistered_dialects else module
    return count_dispatches(source, target=options.target, options=options, flags=chosen).count
