"""The `tori` dialect: facts that Dynamo established about a graph's values, kept
in the IR at the `tori` stage for passes to use and for users to read in dumps.

Every op is an identity (its result is its operand, of the same type) carrying
attributes; `tori-lower-dialect` replaces each by its operand before IREE.

    %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 2 : i64, max = "inf", divisor = 8 : i64}
           : (!torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32>
    %1 = "tori.int_facts"(%arg1) {min = 2 : i64, max = 64 : i64, divisor = 1 : i64} : (!torch.int) -> !torch.int
    %2 = "tori.assumed_constant"(%lit) {function = "model.table", source = "model.py:12"}
           : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>

`max = "inf"` is an unbounded range; `min == max` pins the dimension to one size.
"""

# No `from __future__ import annotations`: the ops' fields are read from live annotations.
import re
import threading
from dataclasses import dataclass
from typing import Any

from torch_mlir import ir
from torch_mlir.dialects.ext import Dialect, Operand, Result, result

UNBOUNDED = "inf"  # the `max` of a range without an upper bound

# Ops whose result is a compile-time constant: what an assumed constant stands on.
CONSTANT_OPS = frozenset({
    "torch.vtensor.literal", "torch.tensor.literal", "torch.constant.int", "torch.constant.float",
    "torch.constant.bool", "torch.constant.str", "torch.constant.none",
})

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],")


class Tori(Dialect, name="tori"):
    pass


@dataclass(frozen=True)
class Facts:
    """A range [min, max] (max None: unbounded) and a divisor, as an op carries them."""

    min: int
    max: int | None
    divisor: int

    @classmethod
    def of(cls, op: ir.Operation) -> "Facts":
        bound = op.attributes["max"]
        upper = None if isinstance(bound, ir.StringAttr) else ir.IntegerAttr(bound).value
        return cls(ir.IntegerAttr(op.attributes["min"]).value, upper, ir.IntegerAttr(op.attributes["divisor"]).value)

    @property
    def pinned(self) -> int | None:
        """The one value these facts allow, when min == max."""
        return self.min if self.min == self.max else None

    def problem(self) -> str | None:
        """Why these facts contradict themselves, or None."""
        if self.min < 0:
            return f"min {self.min} is negative"
        if self.max is not None and self.min > self.max:
            return f"min {self.min} is greater than max {self.max}"
        if self.divisor < 1:
            return f"divisor {self.divisor} is not at least 1"
        if self.pinned is not None and self.pinned % self.divisor:
            return f"the pinned size {self.pinned} is not a multiple of divisor {self.divisor}"
        return None

    def admits(self, value: int) -> bool:
        return self.min <= value and (self.max is None or value <= self.max) and value % self.divisor == 0

    def attributes(self) -> dict[str, ir.Attribute]:
        i64 = ir.IntegerType.get_signless(64)
        upper = ir.StringAttr.get(UNBOUNDED) if self.max is None else ir.IntegerAttr.get(i64, self.max)
        return {"min": ir.IntegerAttr.get(i64, self.min), "max": upper, "divisor": ir.IntegerAttr.get(i64, self.divisor)}

    def __str__(self) -> str:
        upper = UNBOUNDED if self.max is None else self.max
        return f"[{self.min}, {upper}]" + (f" % {self.divisor}" if self.divisor > 1 else "")


def tensor_sizes(type_: ir.Type) -> list[int | None] | None:
    """The sizes of a `!torch.vtensor` type (None for `?`), None when unranked or not one."""
    match = _VTENSOR.match(str(type_))
    if match is None:
        return None
    text = match.group(1).strip()
    return [None if size.strip() == "?" else int(size) for size in text.split(",")] if text else []


def _fail(op: ir.Operation, message: str) -> bool:
    op.location.emit_error(f"'{op.name}' op {message}")
    return False


def _verify_identity(op: ir.Operation) -> bool:
    if op.results[0].type != op.operands[0].type:
        return _fail(op, f"result type {op.results[0].type} differs from operand type {op.operands[0].type}")
    return True


def _verify_facts(op: ir.Operation) -> tuple[bool, Facts | None]:
    bound = op.attributes["max"]
    if isinstance(bound, ir.StringAttr) and bound.value != UNBOUNDED:
        return _fail(op, f'max is "{bound.value}"; an unbounded max is written "{UNBOUNDED}"'), None
    facts = Facts.of(op)
    problem = facts.problem()
    if problem:
        return _fail(op, f"has contradictory facts: {problem}"), None
    return True, facts


class DimFactsOp(Tori.Operation, name="dim_facts"):
    """Facts about dimension `dim` of a tensor: its range, divisor, or one pinned size."""

    input: Operand[Any]
    dim: ir.IntegerAttr
    min: ir.IntegerAttr
    max: ir.IntegerAttr | ir.StringAttr
    divisor: ir.IntegerAttr
    output: Result[Any] = result()

    @staticmethod
    def verify_invariants(op: ir.Operation) -> bool:
        if not _verify_identity(op):
            return False
        sizes = tensor_sizes(op.operands[0].type)
        if sizes is None and not str(op.operands[0].type).startswith("!torch.vtensor"):
            return _fail(op, f"operand must be a !torch.vtensor, not {op.operands[0].type}")
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        if dim < 0 or (sizes is not None and dim >= len(sizes)):
            rank = "an unranked tensor" if sizes is None else f"a tensor of rank {len(sizes)}"
            return _fail(op, f"dim {dim} is out of range for {rank}")
        ok, facts = _verify_facts(op)
        if not ok:
            return False
        size = sizes[dim] if sizes is not None else None
        if size is not None and not facts.admits(size):
            return _fail(op, f"static size {size} of dim {dim} violates its facts {facts}")
        return True


class IntFactsOp(Tori.Operation, name="int_facts"):
    """Facts about a symbolic int (a size Dynamo passes as a `!torch.int` argument)."""

    input: Operand[Any]
    min: ir.IntegerAttr
    max: ir.IntegerAttr | ir.StringAttr
    divisor: ir.IntegerAttr
    output: Result[Any] = result()

    @staticmethod
    def verify_invariants(op: ir.Operation) -> bool:
        if not _verify_identity(op):
            return False
        if str(op.operands[0].type) != "!torch.int":
            return _fail(op, f"operand must be a !torch.int, not {op.operands[0].type}")
        ok, _ = _verify_facts(op)
        return ok


class AssumedConstantOp(Tori.Operation, name="assumed_constant"):
    """A constant that Dynamo computed by calling an `assume_constant_result` function:
    `function` is its qualified name, `source` where the graph called it (may be "")."""

    input: Operand[Any]
    function: ir.StringAttr
    source: ir.StringAttr
    output: Result[Any] = result()

    @staticmethod
    def verify_invariants(op: ir.Operation) -> bool:
        if not _verify_identity(op):
            return False
        if not ir.StringAttr(op.attributes["function"]).value:
            return _fail(op, "needs the name of the function whose result it is")
        owner = op.operands[0].owner
        if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
            owner = owner.operation
        if not isinstance(owner, ir.Operation) or owner.name not in CONSTANT_OPS:
            return _fail(op, "operand must be a constant (a literal or torch.constant.*)")
        return True


OPS = (DimFactsOp, IntFactsOp, AssumedConstantOp)
OP_NAMES = frozenset(op.OPERATION_NAME for op in OPS)


_LOAD_LOCK = threading.Lock()


def load(context: ir.Context) -> None:
    """Load the dialect into `context` (once per context). One thread at a time: two
    threads compiling at once crashed the interpreter inside Torch-MLIR's Python
    dialect loading (a segmentation fault in test_reliability's concurrent compiles)."""
    with _LOAD_LOCK, context:
        Tori.load()


def dim_facts(value: ir.Value, dim: int, facts: Facts) -> ir.Value:
    """`value` through a `tori.dim_facts` op, at the current insertion point and location."""
    i64 = ir.IntegerType.get_signless(64)
    op = ir.Operation.create(DimFactsOp.OPERATION_NAME, results=[value.type], operands=[value],
                             attributes={"dim": ir.IntegerAttr.get(i64, dim), **facts.attributes()})
    return op.results[0]


def int_facts(value: ir.Value, facts: Facts) -> ir.Value:
    op = ir.Operation.create(IntFactsOp.OPERATION_NAME, results=[value.type], operands=[value],
                             attributes=facts.attributes())
    return op.results[0]


def assumed_constant(value: ir.Value, function: str, source: str = "") -> ir.Value:
    op = ir.Operation.create(AssumedConstantOp.OPERATION_NAME, results=[value.type], operands=[value],
                             attributes={"function": ir.StringAttr.get(function), "source": ir.StringAttr.get(source)})
    return op.results[0]
