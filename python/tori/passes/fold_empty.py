"""tori-fold-empty-tensors: put a literal in place of every tensor with no elements,
so that tori-fold-constants evaluates what is computed from it. iree-compile crashes
(SIGFPE, a division by a zero extent) on many ops over empty tensors: mm of (0, 5)
by (5, 10), reciprocal of (1, 0, 3), pixel_shuffle, unfold, bilinear.

Rewrites: each `!torch.vtensor` value of static shape with a zero extent (a function
argument or an op's result) becomes a `torch.vtensor.literal(dense<> : tensor<...>)`
of the same type for its users: it holds no value, so any literal is the value. A
`torch.aten.*` op or literal whose results all become unused is erased (the torch
dialect's value-semantics ops have no side effects).

A uint8 result of the function gets a `torch.aten.empty.memory_format` instead: IREE
folds a returned constant into a literal of signless i8, which its verifier then
rejects ("inferred type(s) '!torch.vtensor<[0],si8>'"), as for
`_batch_norm_with_update`'s empty reserve.

Never changes: values of dynamic or unknown shape, the function's signature (an empty
argument stays, unused), ops that are not `torch.aten.*`.

Example:
    func.func @f(%arg0: !torch.vtensor<[0,5],f32>) -> !torch.vtensor<[0,5],f32> {
      %0 = torch.aten.reciprocal %arg0 : !torch.vtensor<[0,5],f32> -> !torch.vtensor<[0,5],f32>
      return %0 : !torch.vtensor<[0,5],f32>
    }
becomes
    func.func @f(%arg0: !torch.vtensor<[0,5],f32>) -> !torch.vtensor<[0,5],f32> {
      %0 = torch.vtensor.literal(dense<> : tensor<0x5xf32>) : !torch.vtensor<[0,5],f32>
      return %0 : !torch.vtensor<[0,5],f32>
    }
"""

from __future__ import annotations

import logging
import re

from torch_mlir import ir

from tori.passes.registry import register_pass

log = logging.getLogger("tori.passes.fold_empty")

# !torch.vtensor<[2,0,3],f32>: static extents and an element type a builtin tensor holds.
_VTENSOR = re.compile(r"^!torch\.vtensor<\[([0-9,]*)\],(\w+)>$")
_BUILTIN_ELEMENT = {"f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64", "i1": "i1",
                    "si8": "si8", "ui8": "ui8", "si16": "si16", "si32": "si32", "si64": "si64"}


def _empty_builtin(type_: ir.Type) -> ir.RankedTensorType | None:
    """The builtin tensor type of a static, zero-element `!torch.vtensor`, else None."""
    match = _VTENSOR.match(str(type_))
    if not match or match.group(2) not in _BUILTIN_ELEMENT:
        return None
    shape = [int(d) for d in match.group(1).split(",") if d]
    if 0 not in shape:
        return None
    return ir.RankedTensorType.get(shape, ir.Type.parse(_BUILTIN_ELEMENT[match.group(2)]))


def _has_uses(value: ir.Value) -> bool:
    return any(True for _ in value.uses)


def _replace(value: ir.Value, insertion: ir.InsertionPoint, location: ir.Location) -> bool:
    """Put an empty literal in place of `value` when it is an empty tensor with users."""
    if not _has_uses(value):
        return False
    with insertion, location:
        builtin = _empty_builtin(value.type)
        if builtin is None:
            return False
        literal = ir.Operation.create("torch.vtensor.literal", results=[value.type],
                                      attributes={"value": ir.Attribute.parse(f"dense<> : {builtin}")})
    value.replace_all_uses_with(literal.results[0])
    if builtin.element_type == ir.IntegerType.get_unsigned(8):
        for use in list(literal.results[0].uses):
            if use.owner.name == "func.return":
                with ir.InsertionPoint(use.owner), location:
                    use.owner.operands[use.operand_number] = _empty_op(value.type, builtin.shape)
    return True


def _empty_op(type_: ir.Type, shape: list[int]) -> ir.Value:
    """`torch.aten.empty.memory_format` of a uint8 `type_` (dtype code 0), on the CPU."""
    def constant(kind: str, result: str, attr: ir.Attribute | None = None) -> ir.Value:
        attributes = {"value": attr} if attr is not None else {}
        return ir.Operation.create(f"torch.constant.{kind}", results=[ir.Type.parse(result)],
                                   attributes=attributes).results[0]

    def integer(n: int) -> ir.Value:
        return constant("int", "!torch.int", ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n))

    sizes = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                                operands=[integer(n) for n in shape]).results[0]
    none = constant("none", "!torch.none")
    operands = [sizes, integer(0), none, constant("device", "!torch.Device", ir.StringAttr.get("cpu")),
                constant("bool", "!torch.bool", ir.BoolAttr.get(False)), none]
    return ir.Operation.create("torch.aten.empty.memory_format", results=[type_], operands=operands).results[0]


def _fold_block(block: ir.Block) -> int:
    replaced = 0
    operations = list(block.operations)
    if operations:
        start = ir.InsertionPoint.at_block_begin(block)
        for argument in block.arguments:
            replaced += _replace(argument, start, operations[0].location)
    for child in operations:
        op = child.operation
        for region in op.regions:
            for nested in region.blocks:
                replaced += _fold_block(nested)
        if op.name == "torch.vtensor.literal":
            continue
        for result in op.results:
            replaced += _replace(result, ir.InsertionPoint(op), op.location)
    return replaced


def _erase_unused(block: ir.Block) -> None:
    # In reverse order, so that an op's users go before it.
    for child in reversed(list(block.operations)):
        op = child.operation
        for region in op.regions:
            for nested in region.blocks:
                _erase_unused(nested)
        pure = op.name.startswith("torch.aten.") or op.name == "torch.vtensor.literal"
        if pure and op.results and not any(_has_uses(r) for r in op.results):
            op.erase()


@register_pass("tori-fold-empty-tensors")
def fold_empty_tensors(op: ir.Operation, pass_: object) -> None:
    """Put literals in place of tensors with no elements, for tori-fold-constants to fold."""
    replaced = 0
    for region in op.regions:
        for block in region.blocks:
            replaced += _fold_block(block)
            _erase_unused(block)
    log.debug("replaced %d empty tensors", replaced)
