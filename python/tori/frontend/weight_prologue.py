"""Weight prologues: the ops of an inference graph that read only its resident weights
(frontend/resident.py) run in PyTorch when the weights are loaded, not in IREE.

BatchNorm's scale and shift from its statistics, a grouped convolution's weight
reshaped and copied per image for its batched matmul: computed from immutable globals,
IREE hoists the first kind into the module's initializer (an executable each) and
leaves the second in every call, since hoisting would grow the value (RegNetY-1.6GF
at batch 8: 48.9 ms of its 325 ms of dispatches, docs/performance.md). Here they become a small program of
ATen ops, run once per load with the weights loaded; each value it hands the module
is a resident global of its own (`derived_name`). What the module reads as it is
stays there: a weight seen through views (a linear layer's transpose), and a widened
copy of a narrow weight (an int8 weight dequantized), which would cost memory and
hide the integer matmul from tori-int8-weight-matmul.

The program is data (ops by name, arguments by position), so that the graph cache
(frontend/graph_cache.py) keeps it in JSON with the rest of the signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import torch
import torch.fx

from tori.aot.parameters import BUILTIN_ELEMENT

# A derived value may be larger than the weights it reads (a weight copied per image)
# up to this many times, or up to LARGE_BYTES whatever its inputs.
GROWTH = 2
LARGE_BYTES = 16 * 2 ** 20


def derived_name(index: int) -> str:
    return f"derived{index}"


@dataclass(frozen=True)
class Ref:
    """A value of the prologue: graph input `index` (a resident weight) when `input`,
    else the result of step `index`."""

    index: int
    input: bool = False


@dataclass(frozen=True)
class Step:
    op: str          # an ATen overload's qualified name: "aten.mul.Tensor"
    args: tuple
    kwargs: tuple    # (name, value) pairs


@dataclass(frozen=True)
class Prologue:
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # the steps whose results the module reads, in `derived_name` order

    def run(self, args) -> list[torch.Tensor]:
        """The derived values from the graph's arguments (its resident weights among them)."""
        with torch.no_grad():
            return [value.contiguous() for value in self._code(args)]

    @cached_property
    def _code(self) -> Callable:
        return self.function(lambda step: _overload(step.op))

    def function(self, op_for: Callable[[Step], Callable], read: Callable | None = None) -> Callable:
        """The steps as one Python function of the arguments, each step's op from
        `op_for(step)` and each argument the steps read through `read` (as it is when
        None): a program runs on every call of its graph (frontend/input_checks.py),
        where resolving each step's op and arguments anew cost more than the ops
        themselves."""
        constants: list[Any] = []

        def source(arg) -> str:
            if isinstance(arg, Ref):
                if not arg.input:
                    return f"v{arg.index}"
                return f"read(args[{arg.index}])" if read is not None else f"args[{arg.index}]"
            if isinstance(arg, (list, tuple)) and _refers(arg):
                return "[" + "".join(f"{source(a)}, " for a in arg) + "]"
            constants.append(arg)
            return f"constants[{len(constants) - 1}]"

        lines = ["def code(args):"]
        for n, step in enumerate(self.steps):
            arguments = [source(a) for a in step.args] + [f"**{{{k!r}: {source(v)}}}" for k, v in step.kwargs]
            lines.append(f"    v{n} = ops[{n}]({', '.join(arguments)})")
        lines.append(f"    return ({''.join(f'v{i}, ' for i in self.outputs)})")
        scope = {"ops": tuple(op_for(step) for step in self.steps), "constants": tuple(constants), "read": read}
        exec("\n".join(lines), scope)
        return scope["code"]

    def to_json(self) -> dict:
        return {"steps": [{"op": s.op, "args": _encode(s.args), "kwargs": [[k, _encode(v)] for k, v in s.kwargs]}
                          for s in self.steps], "outputs": list(self.outputs)}

    @staticmethod
    def from_json(encoded: dict) -> Prologue:
        steps = []
        for step in encoded["steps"]:
            _overload(step["op"])  # an unknown op is a ValueError now, not at load
            steps.append(Step(str(step["op"]), _decode(step["args"]), tuple((str(k), _decode(v))
                                                                              for k, v in step["kwargs"])))
        return Prologue(tuple(steps), tuple(int(i) for i in encoded["outputs"]))


def _refers(arg) -> bool:
    return isinstance(arg, Ref) or isinstance(arg, (list, tuple)) and any(_refers(a) for a in arg)


def _overload(name: str) -> torch._ops.OpOverload:
    namespace, op, overload = name.split(".")
    found = getattr(getattr(getattr(torch.ops, namespace), op, None), overload, None)
    if not isinstance(found, torch._ops.OpOverload):
        raise ValueError(f"unknown ATen op {name!r}")
    return found


def _encode(arg):
    if isinstance(arg, Ref):
        return {"ref": arg.index, "input": arg.input}
    if isinstance(arg, (torch.dtype, torch.memory_format, torch.layout)):
        return {"torch": str(arg).removeprefix("torch.")}
    if isinstance(arg, torch.device):
        return {"device": str(arg)}
    if isinstance(arg, (list, tuple)):
        return [_encode(a) for a in arg]
    return arg


def _decode(arg):
    if isinstance(arg, dict):
        if "torch" in arg:
            found = getattr(torch, str(arg["torch"]), None)
            if not isinstance(found, (torch.dtype, torch.memory_format, torch.layout)):
                raise ValueError(f"unknown dtype, memory format or layout {arg['torch']!r}")
            return found
        if "device" in arg:
            return torch.device(str(arg["device"]))
        return Ref(int(arg["ref"]), bool(arg["input"]))
    if isinstance(arg, list):
        return tuple(_decode(a) for a in arg)
    return arg


_PLAIN = (int, float, bool, type(None), str, torch.dtype, torch.memory_format, torch.layout, torch.device)


def _static_tensor(node: torch.fx.Node) -> torch.Tensor | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.dtype in BUILTIN_ELEMENT and value.device.type == "cpu" \
            and all(isinstance(d, int) for d in value.shape):
        return value
    return None


def _bytes(value: torch.Tensor) -> int:
    return value.numel() * value.element_size()


def _widens(node: torch.fx.Node) -> bool:
    """Whether `node` is a wider copy of one of its inputs (an int8 weight dequantized)."""
    value = node.meta["val"]
    return any(value.element_size() > n.meta["val"].element_size() and value.numel() >= n.meta["val"].numel()
               for n in node.all_input_nodes)


def _weight_only(node: torch.fx.Node, known: dict[torch.fx.Node, Any]) -> bool:
    """Whether `node` is a deterministic ATen op of one static tensor result whose
    inputs are all known to the prologue, with arguments it can write down."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags or node.target._schema.is_mutable:
        return False
    if _static_tensor(node) is None or not node.all_input_nodes or any(u.op == "output" for u in node.users):
        return False  # a value the graph returns stays the module's own, never a global's buffer
    return writable(node, known)


def writable(node: torch.fx.Node, known) -> bool:
    """Whether a program can write `node`'s arguments down: values of `known` nodes and
    plain constants."""
    def plain(arg) -> bool:
        if isinstance(arg, torch.fx.Node):
            return arg in known
        if isinstance(arg, (list, tuple)):
            return all(plain(a) for a in arg)
        return isinstance(arg, _PLAIN)

    return plain(node.args) and plain(tuple(node.kwargs.values()))


def extract(gm: torch.fx.GraphModule, resident: frozenset[int]) -> tuple[Prologue, list[torch.fx.Node]] | None:
    """The prologue of `gm` over its resident inputs, and the nodes whose values it
    hands the module (in `derived_name` order); None when there is nothing to hoist."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    inputs = {placeholders[i]: Ref(i, input=True) for i in resident}
    behind: dict[torch.fx.Node, int] = {node: _bytes(node.meta["val"]) for node in inputs}  # weights' bytes
    raw = set(inputs)  # the weights and views of them
    for node in gm.graph.nodes:
        if not _weight_only(node, behind):
            continue
        read, size = sum(behind[n] for n in node.all_input_nodes), _bytes(node.meta["val"])
        if size > max(GROWTH * read, LARGE_BYTES):
            continue  # the module computes it
        if _widens(node):
            continue  # int8 and 16-bit weights stay narrow in memory: the module widens them as it reads
        # A weight seen through views (a transpose for a matmul) costs IREE nothing to
        # read as it is, and would cost a second copy here: the module keeps such views
        # for itself and the prologue hands it only what is computed from them.
        if node.target.is_view and size <= read and all(n in raw for n in node.all_input_nodes):
            raw.add(node)
        behind[node] = read
    handed = [node for node in behind if node not in raw and not all(user in behind for user in node.users)]
    if not handed:
        return None
    return program(gm, inputs, handed), handed


def program(gm: torch.fx.GraphModule, inputs: dict[torch.fx.Node, Ref], outputs: list[torch.fx.Node]) -> Prologue:
    """The steps of `gm` that compute `outputs` from `inputs` (placeholders, as Refs), in
    graph order; a step equal to an earlier one (the same op on the same values) is not
    repeated."""
    needed, stack = set(), list(outputs)
    while stack:
        node = stack.pop()
        if node not in needed and node not in inputs:
            needed.add(node)
            stack += node.all_input_nodes
    known: dict[torch.fx.Node, Ref] = dict(inputs)

    def ref(arg):
        if isinstance(arg, torch.fx.Node):
            return known[arg]
        if isinstance(arg, (list, tuple)):
            return tuple(ref(a) for a in arg)
        return arg

    steps: dict[tuple, Step] = {}  # by _same_step's key
    places: dict[tuple, int] = {}
    for node in gm.graph.nodes:
        if node in needed:
            step = Step(str(node.target).replace("::", "."), ref(node.args),
                        tuple((k, ref(v)) for k, v in node.kwargs.items()))
            key = _same_step(step)
            if key not in places:
                places[key] = len(steps)
                steps[key] = step
            known[node] = Ref(places[key])
    return Prologue(tuple(steps.values()), tuple(known[n].index for n in outputs))


def _same_step(step: Step) -> tuple:
    """What two equal steps share: numbers compared with their types (1, 1.0 and True
    promote differently) and their signs (-0.0)."""
    def typed(arg):
        if isinstance(arg, (list, tuple)):
            return tuple(typed(a) for a in arg)
        return (type(arg).__name__, repr(arg))

    return step.op, typed(step.args), typed(step.kwargs)
