"""Input checks: tori's bounds and division checks (frontend/decomp/checks.py) whose
condition reads only the graph's arguments run in PyTorch before the module is called,
not in IREE.

In the module, a check is a `torch.runtime.assert` on a value the device computes: the
host waits for it before going on, once per check. A decoding step of the benchmarks'
Llama checks its cache position once per layer for the keys and again for the values,
and its token ids once: 9 waits per token that split IREE's queue of work. Its index
tensors are graph arguments, so the same conditions (a minimum and a maximum of a
few integers) cost microseconds in PyTorch, each distinct condition once.

Only checks whose every step is a view or a cheap op of `_CHEAP` (reductions to a
minimum or maximum, comparisons, conversions) leave the module; a check on an index
the graph computes stays there. The checks are a program of ATen ops over the
arguments (weight_prologue.program, the form the graph cache keeps in JSON), with
the message of each condition; a failing one raises the error its message names
(`tori.errors.runtime_check_error`), as the module's assert would have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from tori.errors import is_check_message, runtime_check_error
from tori.frontend.weight_prologue import Prologue, Ref, program, writable

_ASSERTS = (torch.ops.aten._assert_async.msg,)
# The ops a hoisted check may run besides views: what checks.py builds its conditions
# from, and the index arithmetic in front of them (transformers' cache writes index
# `arange(0, n) + cache_position`).
_CHEAP = frozenset({"amin", "amax", "ge", "gt", "le", "lt", "eq", "ne", "bitwise_and", "logical_and",
                    "_to_copy", "convert_element_type", "clone", "sym_size", "arange", "add", "sub", "mul",
                    "neg", "where"})


@dataclass(frozen=True)
class InputChecks:
    conditions: Prologue  # one 0-d bool per message, from the graph's arguments
    messages: tuple[str, ...]

    def verify(self, args, graph: str) -> None:
        """Raise the check's error for the first condition that `args` fail."""
        for ok, message in zip(self.conditions.run(args), self.messages):
            if not bool(ok):
                raise runtime_check_error(message)(f"compiled graph '{graph}': {message}")

    def to_json(self) -> dict:
        return {"conditions": self.conditions.to_json(), "messages": list(self.messages)}

    @staticmethod
    def from_json(encoded: dict) -> InputChecks:
        return InputChecks(Prologue.from_json(encoded["conditions"]), tuple(str(m) for m in encoded["messages"]))


def _tori_check(node: torch.fx.Node) -> bool:
    """An assert tori's checks made (a user's own `_assert_async` stays in the module:
    its failure falls back to eager, which raises the user's error)."""
    return node.op == "call_function" and node.target in _ASSERTS and len(node.args) > 1 and \
        isinstance(node.args[1], str) and is_check_message(node.args[1])


def _cheap(node: torch.fx.Node, from_inputs: set[torch.fx.Node]) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target._schema.is_mutable or not (node.target.is_view or node.target._opname in _CHEAP):
        return False
    return writable(node, from_inputs)


def split(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, InputChecks | None]:
    """`gm` without its checks on arguments (a copy; `gm` itself when it has none) and
    those checks."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    from_inputs = set(placeholders)
    hoisted = []
    for node in gm.graph.nodes:
        if _tori_check(node) and node.args[0] in from_inputs and node.args[0].op != "placeholder":
            hoisted.append(node)
        elif _cheap(node, from_inputs):
            from_inputs.add(node)
    if not hoisted:
        return gm, None
    inputs = {p: Ref(i, input=True) for i, p in enumerate(placeholders)}
    conditions = program(gm, inputs, [node.args[0] for node in hoisted])
    # Each distinct condition and message once: a cache position checked by every layer.
    distinct = dict.fromkeys(zip(conditions.outputs, (node.args[1] for node in hoisted)))
    checks = InputChecks(Prologue(conditions.steps, tuple(i for i, _ in distinct)), tuple(m for _, m in distinct))
    graph, copies = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, copies))
    for node in hoisted:
        graph.erase_node(copies[node])
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph), checks
