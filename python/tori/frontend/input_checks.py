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

The conditions run in NumPy where every argument they read is an integer or boolean
CPU tensor and every step has a NumPy form of the same integer semantics (`_NUMPY`):
a PyTorch op on a one-element tensor cost 3-10 us, NumPy's about 0.5, and the
decoding step's five conditions are 35 ops (375 us of a 5-7 ms call in PyTorch).
Anything else, and any error on the way (an empty index tensor's minimum), runs the
program in PyTorch, whose result or error stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
import torch
import torch.fx

from tori.errors import is_check_message, runtime_check_error
from tori.frontend.import_copies import import_copy
from tori.frontend.weight_prologue import Prologue, Ref, Step, program, writable

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
        for ok, message in zip(self.results(args), self.messages):
            if not bool(ok):
                raise runtime_check_error(message)(f"compiled graph '{graph}': {message}")

    def results(self, args) -> tuple:
        """Each condition's value for `args`: in NumPy where it can run there, else in PyTorch."""
        if self.in_numpy is not None:
            try:
                return self.in_numpy(args)
            except Exception:  # an argument NumPy does not take, or an op's error: PyTorch decides
                pass
        return tuple(self.conditions.run(args))

    @cached_property
    def in_numpy(self) -> Callable | None:
        """The conditions as a function over NumPy arrays, None where a step has no NumPy form."""
        try:
            return self.conditions.function(_numpy_op, read=_array)
        except _NoNumpyForm:
            return None

    def to_json(self) -> dict:
        return {"conditions": self.conditions.to_json(), "messages": list(self.messages)}

    @staticmethod
    def from_json(encoded: dict) -> InputChecks:
        return InputChecks(Prologue.from_json(encoded["conditions"]), tuple(str(m) for m in encoded["messages"]))


class _NoNumpyForm(Exception):
    pass


_INTEGER_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
                   torch.uint8: np.uint8, torch.bool: np.bool_}


def _array(value):
    """An integer or boolean CPU tensor as a NumPy array sharing its memory (other
    values as they are); anything else is for PyTorch."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type != "cpu" or value.dtype not in _INTEGER_DTYPES:
        raise _NoNumpyForm(f"a {value.dtype} tensor on {value.device}")
    return value.detach().numpy() if value.requires_grad else value.numpy()


def _reduce(reduction: str):
    def reduce(x, dim=(), keepdim=False):
        return getattr(np.asarray(x), reduction)(axis=tuple(dim) if dim else None, keepdims=keepdim)
    return reduce


def _scaled(ufunc):
    def apply(a, b, alpha=1):
        return ufunc(a, b) if alpha == 1 else ufunc(a, np.multiply(b, alpha))
    return apply


def _arange(start, end=None, step=1, dtype=None, **_):
    if dtype not in (None, torch.int64):
        raise _NoNumpyForm(f"arange of {dtype}")
    return np.arange(start, end, step, dtype=np.int64) if end is not None else np.arange(start, dtype=np.int64)


def _convert(x, dtype=None, **_):
    if dtype is None:
        return np.array(x, copy=True)
    if dtype not in _INTEGER_DTYPES:
        raise _NoNumpyForm(f"a conversion to {dtype}")
    return np.asarray(x).astype(_INTEGER_DTYPES[dtype])


def _expand(x, size, **_):
    x = np.asarray(x)
    lead = len(size) - x.ndim
    return np.broadcast_to(x, [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)])


def _squeeze_dim(x, dim):
    return np.squeeze(x, axis=dim) if np.shape(x)[dim] == 1 else x


def _slice(x, dim=0, start=None, end=None, step=1):
    return np.asarray(x)[(slice(None),) * (dim % np.ndim(x)) + (slice(start, end, step),)]


# The steps of a check with NumPy forms of the same semantics on integer and boolean
# arrays (with an integer or boolean scalar: a float one would promote differently).
_NUMPY: dict[str, Callable] = {
    "aten.view.default": np.reshape, "aten.reshape.default": np.reshape, "aten._unsafe_view.default": np.reshape,
    "aten.amin.default": _reduce("min"), "aten.amax.default": _reduce("max"),
    **{f"aten.{name}.{overload}": ufunc for name, ufunc in (
        ("ge", np.greater_equal), ("gt", np.greater), ("le", np.less_equal), ("lt", np.less),
        ("eq", np.equal), ("ne", np.not_equal), ("bitwise_and", np.bitwise_and))
       for overload in ("Scalar", "Tensor")},
    "aten.logical_and.default": np.logical_and,
    "aten.add.Tensor": _scaled(np.add), "aten.sub.Tensor": _scaled(np.subtract),
    "aten.mul.Tensor": np.multiply, "aten.neg.default": np.negative,
    "aten.where.self": np.where,
    "aten.arange.default": _arange, "aten.arange.start": _arange, "aten.arange.start_step": _arange,
    "aten.clone.default": _convert, "aten._to_copy.default": _convert, "prims.convert_element_type.default": _convert,
    "aten.sym_size.int": lambda x, dim: np.shape(x)[dim],
    "aten.unsqueeze.default": np.expand_dims, "aten.squeeze.dim": _squeeze_dim, "aten.squeeze.default": np.squeeze,
    "aten.permute.default": np.transpose, "aten.expand.default": _expand,
    "aten.select.int": lambda x, dim, index: np.take(x, index, axis=dim), "aten.slice.Tensor": _slice,
}


def _numpy_op(step: Step) -> Callable:
    def floats(arg) -> bool:
        return isinstance(arg, float) or isinstance(arg, (list, tuple)) and any(floats(a) for a in arg)

    if step.op not in _NUMPY or floats(step.args) or floats(tuple(v for _, v in step.kwargs)):
        raise _NoNumpyForm(step.op)
    return _NUMPY[step.op]


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
    return import_copy(gm, graph), checks
