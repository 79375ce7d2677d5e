"""Helpers that tori's fusion passes share to match and rewrite torch-dialect IR:
reading types and constants, walking to producers and users, creating constants
and erasing what a rewrite left unused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from torch_mlir import ir

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(\w+)>$")
FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})


class NoMatch(Exception):
    """The IR is not in the form a pattern needs."""


@dataclass(frozen=True)
class TensorType:
    """A `!torch.vtensor` with a known rank; None marks a dynamic dimension."""

    shape: tuple[int | None, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def static(self) -> bool:
        return None not in self.shape

    def text(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"!torch.vtensor<[{dims}],{self.dtype}>"

    def with_shape(self, shape: Iterable[int | None]) -> "TensorType":
        return TensorType(tuple(shape), self.dtype)


def tensor_type(value: ir.Value) -> TensorType | None:
    match = _VTENSOR.match(str(value.type))
    if not match:
        return None
    shape = tuple(None if d == "?" else int(d) for d in match.group(1).split(",") if d)
    return TensorType(shape, match.group(2))


def expect_type(value: ir.Value) -> TensorType:
    type_ = tensor_type(value)
    if type_ is None or not type_.static:
        raise NoMatch(f"not a static tensor: {value.type}")
    return type_


def producer(value: ir.Value, *names: str) -> ir.Operation | None:
    """The op that defines `value` if it is one of `names` (any op when none given)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation
    return op if not names or op.name in names else None


def expect(value: ir.Value, *names: str) -> ir.Operation:
    op = producer(value, *names)
    if op is None:
        raise NoMatch(f"expected {' or '.join(names)}")
    return op


def users(value: ir.Value) -> list[ir.Operation]:
    return [use.owner.operation if hasattr(use.owner, "operation") else use.owner for use in value.uses]


def single_user(value: ir.Value, name: str | None = None) -> ir.Operation | None:
    """The one op that uses `value` (of that name, where given), else None."""
    found = users(value)
    return found[0] if len(found) == 1 and name in (None, found[0].name) else None


def constant(value: ir.Value) -> Any:
    """The Python value of a scalar constant or a list of them; NoMatch otherwise."""
    op = producer(value)
    if op is None:
        raise NoMatch("not a constant")
    if op.name == "torch.constant.int":
        return ir.IntegerAttr(op.attributes["value"]).value
    if op.name == "torch.constant.float":
        return ir.FloatAttr(op.attributes["value"]).value
    if op.name == "torch.constant.bool":
        return ir.BoolAttr(op.attributes["value"]).value
    if op.name == "torch.constant.str":
        return ir.StringAttr(op.attributes["value"]).value
    if op.name == "torch.constant.none":
        return None
    if op.name == "torch.prim.ListConstruct":
        return [constant(operand) for operand in op.operands]
    raise NoMatch(f"not a constant: {op.name}")


def number(value: ir.Value) -> float:
    """An int or float constant as a float."""
    result = constant(value)
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise NoMatch("not a number")
    return float(result)


def splat_float(value: ir.Value) -> float:
    """The element of a scalar or splat float tensor literal."""
    op = expect(value, "torch.vtensor.literal")
    attr = op.attributes["value"]
    if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
        raise NoMatch("not a splat literal")
    element = attr.get_splat_value()
    if not isinstance(element, ir.FloatAttr):
        raise NoMatch("not a float literal")
    return element.value


def normalize_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def walk(op: ir.Operation) -> list[ir.Operation]:
    """Every op nested in `op`, in program order."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                found.append(child.operation)
                found.extend(walk(child.operation))
    return found


def only_used_by(ops: Iterable[ir.Operation], allowed: Iterable[ir.Operation]) -> bool:
    """Whether every result of every op in `ops` is used only by ops in `allowed`."""
    allowed = set(allowed)
    return all(user in allowed for op in ops for result in op.results for user in users(result))


# --- building ops -----------------------------------------------------------


def int_constant(value: int) -> ir.Value:
    return ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                               attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)}).result


def float_constant(value: float) -> ir.Value:
    return ir.Operation.create("torch.constant.float", results=[ir.Type.parse("!torch.float")],
                               attributes={"value": ir.FloatAttr.get_f64(value)}).result


def bool_constant(value: bool) -> ir.Value:
    return ir.Operation.create("torch.constant.bool", results=[ir.Type.parse("!torch.bool")],
                               attributes={"value": ir.BoolAttr.get(value)}).result


def none_constant() -> ir.Value:
    return ir.Operation.create("torch.constant.none", results=[ir.Type.parse("!torch.none")]).result


def int_list(values: Iterable[int]) -> ir.Value:
    items = [int_constant(v) for v in values]
    return ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                               operands=items).result


def create(name: str, result_type: TensorType | str, operands: list[ir.Value]) -> ir.Operation:
    text = result_type.text() if isinstance(result_type, TensorType) else result_type
    return ir.Operation.create(name, results=[ir.Type.parse(text)], operands=operands)


def behind_barrier(value: ir.Value) -> ir.Value:
    """`value` (a float `!torch.vtensor`) through IREE's `util.optimization_barrier`:
    IREE neither folds what computed it into its users nor fuses across it. The
    module's context must allow unregistered dialects (IREE's util)."""
    type_ = tensor_type(value)
    builtin = f"tensor<{'x'.join([*('?' if d is None else str(d) for d in type_.shape), type_.dtype])}>"
    tensor = create("torch_c.to_builtin_tensor", builtin, [value]).result
    kept = create("util.optimization_barrier", builtin, [tensor]).result
    return create("torch_c.from_builtin_tensor", type_, [kept]).result


# --- erasing ----------------------------------------------------------------

_CONSTANT_LIKE = ("torch.constant.", "torch.vtensor.literal", "torch.prim.ListConstruct")


def _unused(op: ir.Operation) -> bool:
    return not any(True for result in op.results for _ in result.uses)


def erase_unused(ops: Iterable[ir.Operation]) -> None:
    """Erase the ops of a replaced pattern once nothing uses them (users first),
    then the constants and lists that only they used."""
    # Ops are keyed by hash (the underlying pointer), taken while they are valid:
    # an erased op's Python object cannot be compared any more.
    pending = {hash(op): op for op in ops}
    erased: set[int] = set()
    feeders: dict[int, ir.Operation] = {}

    def erase(key: int, op: ir.Operation) -> None:
        for operand in op.operands:
            fed = producer(operand)
            if fed is not None and hash(fed) not in erased:
                feeders.setdefault(hash(fed), fed)
        erased.add(key)
        op.erase()

    progress = True
    while pending and progress:
        progress = False
        for key, op in list(pending.items()):
            if _unused(op):
                del pending[key]
                erase(key, op)
                progress = True
    while feeders:
        key, op = feeders.popitem()
        if key not in erased and key not in pending and op.name.startswith(_CONSTANT_LIKE) and _unused(op):
            erase(key, op)
