"""tori-specialize-guards: turn the guard facts on a function's arguments into what
IREE uses: static sizes for pinned dimensions, integer assumptions for the rest.

Rewrites, for each `func.func` and each entry-block argument with facts:
- a `tori.dim_facts` that pins a dynamic dimension (min == max): the argument gets
  that static size in its type (and in the function type), and a
  `torch.tensor_static_info_cast` back to the old type feeds its old uses; IREE's
  canonicalization then propagates the static size;
- every other `tori.dim_facts`: the tensor argument is bound by one
  `torch.bind_symbolic_shape` to `torch.symbolic_int` symbols, a dimension with
  divisor d and range [min, max] written as `d * s` with s in [ceil(min/d),
  floor(max/d)] (an unbounded max: the largest i64); IREE's torch input turns these
  into `util.assume.int` (umin, umax, udiv) on the dimension;
- a `tori.int_facts` that pins a `!torch.int` argument: its uses read a
  `torch.constant.int` of that value instead.

Never changes: the facts themselves (tori-lower-dialect removes them), the number,
order and kinds of the function's arguments (a pinned size is guaranteed by the
guards under which the graph runs, so callers pass the same tensors), arguments
without facts, and arguments already bound by a `torch.bind_symbolic_shape`.

Example:
    func.func @main(%arg0: !torch.vtensor<[?,4],f32>, %arg1: !torch.vtensor<[?],f32>) ... {
      %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, divisor = 8 : i64, max = 64 : i64, min = 16 : i64} ...
      %1 = "tori.dim_facts"(%arg1) {dim = 0 : i64, divisor = 1 : i64, max = 3 : i64, min = 3 : i64} ...
becomes
    func.func @main(%arg0: !torch.vtensor<[?,4],f32>, %arg1: !torch.vtensor<[3],f32>) ... {
      %cast = torch.tensor_static_info_cast %arg1 : !torch.vtensor<[3],f32> to !torch.vtensor<[?],f32>
      %s0 = torch.symbolic_int "s0" {min_val = 2, max_val = 8} : !torch.int
      torch.bind_symbolic_shape %arg0, [%s0], affine_map<()[s0] -> (s0 * 8, 4)> : !torch.vtensor<[?,4],f32>
      %0 = "tori.dim_facts"(%arg0) ...
      %1 = "tori.dim_facts"(%cast) ...
"""

from __future__ import annotations

import re

from torch_mlir import ir

from tori.dialects.tori import DimFactsOp, Facts, IntFactsOp, tensor_sizes
from tori.passes.registry import register_pass

I64_MAX = (1 << 63) - 1
_VTENSOR_DTYPE = re.compile(r"^!torch\.vtensor<\[[^\]]*\],(.+)>$")


def _func_ops(op: ir.Operation):
    if op.name == "func.func":
        yield op
        return
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                if child.operation.name == "func.func":
                    yield child.operation


def _argument_of(value: ir.Value, block: ir.Block) -> int | None:
    """The index of the entry-block argument `value` reads, through tori facts ops."""
    while True:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return ir.BlockArgument(value).arg_number if owner == block else None
        op = owner.operation
        if op.name not in (DimFactsOp.OPERATION_NAME, IntFactsOp.OPERATION_NAME):
            return None
        value = op.operands[0]


def _collect(block: ir.Block) -> tuple[dict[int, dict[int, Facts]], dict[int, Facts]]:
    """Per argument index: the facts of each of its dims, and the facts of int arguments."""
    dims: dict[int, dict[int, Facts]] = {}
    ints: dict[int, Facts] = {}
    for child in block.operations:
        op = child.operation
        if op.name not in (DimFactsOp.OPERATION_NAME, IntFactsOp.OPERATION_NAME):
            continue
        index = _argument_of(op.operands[0], block)
        if index is None:
            continue
        if op.name == DimFactsOp.OPERATION_NAME:
            dims.setdefault(index, {})[ir.IntegerAttr(op.attributes["dim"]).value] = Facts.of(op)
        else:
            ints[index] = Facts.of(op)
    return dims, ints


def _with_sizes(type_: ir.Type, sizes: list[int | None]) -> ir.Type:
    dtype = _VTENSOR_DTYPE.match(str(type_)).group(1)
    text = ",".join("?" if size is None else str(size) for size in sizes)
    return ir.Type.parse(f"!torch.vtensor<[{text}],{dtype}>")


def _bound(value: ir.Value) -> bool:
    return any(use.owner.name == "torch.bind_symbolic_shape" for use in value.uses)


def _specialize(func: ir.Operation) -> None:
    block = func.regions[0].blocks[0]
    dims, ints = _collect(block)
    if not dims and not ints:
        return
    first = block.operations[0]
    symbols = 0
    with ir.InsertionPoint(first), ir.Location.unknown():
        for index in sorted(ints):
            pinned = ints[index].pinned
            if pinned is not None:
                argument = block.arguments[index]
                constant = ir.Operation.create(
                    "torch.constant.int", results=[argument.type],
                    attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), pinned)}).results[0]
                argument.replace_all_uses_with(constant)
        for index in sorted(dims):
            argument = block.arguments[index]
            sizes = tensor_sizes(argument.type)
            if sizes is None:
                continue
            facts = {dim: f for dim, f in dims[index].items() if dim < len(sizes)}
            pins = {dim: f.pinned for dim, f in facts.items() if f.pinned is not None and sizes[dim] is None}
            old_type, bound = argument.type, _bound(argument)
            if pins:
                sizes = [pins.get(dim, size) for dim, size in enumerate(sizes)]
                argument.set_type(_with_sizes(old_type, sizes))
            # The binding before the cast: IREE ties the argument's later uses to the
            # bound value, and a cast placed first then used a value defined after it.
            binding = None
            if not bound and not all(size is not None for size in sizes):
                symbols, binding = _bind(argument, sizes, facts, symbols)
            if pins:
                cast = ir.Operation.create("torch.tensor_static_info_cast", results=[old_type], operands=[argument])
                argument.replace_all_uses_except(cast.results[0], [cast] + ([binding] if binding else []))
    inputs = [argument.type for argument in block.arguments]
    results = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).results
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, results))


def _bind(argument: ir.Value, sizes: list[int | None], facts: dict[int, Facts],
          next_symbol: int) -> tuple[int, ir.Operation]:
    """Bind `argument`'s dynamic sizes to new symbols with the ranges of `facts`; returns
    the next free symbol number and the binding."""
    i64 = ir.IntegerType.get_signless(64)
    values, exprs = [], []
    for dim, size in enumerate(sizes):
        if size is not None:
            exprs.append(ir.AffineConstantExpr.get(size))
            continue
        fact = facts.get(dim, Facts(0, None, 1))
        divisor = fact.divisor
        low = -(-fact.min // divisor)
        high = I64_MAX if fact.max is None else fact.max // divisor
        symbol = ir.Operation.create(
            "torch.symbolic_int", results=[ir.Type.parse("!torch.int")],
            attributes={"symbol_name": ir.StringAttr.get(f"s{next_symbol}"),
                        "min_val": ir.IntegerAttr.get(i64, low), "max_val": ir.IntegerAttr.get(i64, high)})
        position = len(values)
        values.append(symbol.results[0])
        next_symbol += 1
        expr = ir.AffineSymbolExpr.get(position)
        exprs.append(expr * divisor if divisor > 1 else expr)
    shape = ir.AffineMap.get(0, len(values), exprs)
    binding = ir.Operation.create("torch.bind_symbolic_shape", operands=[argument, *values],
                                  attributes={"shape_expressions": ir.AffineMapAttr.get(shape)})
    return next_symbol, binding


@register_pass("tori-specialize-guards")
def specialize_guards(op: ir.Operation, pass_: object) -> None:
    """Static sizes for pinned dims, symbolic-shape bindings (ranges, divisors) for IREE."""
    for func in list(_func_ops(op)):
        if func.regions[0].blocks:
            _specialize(func)
