"""Helpers the layout passes share: reading the torch dialect (static float32 shapes,
constants, the op that defines a value) and replacing ops with calls of private
functions of builtin tensors, parsed from MLIR text, with `torch_c` casts around them.
"""

from __future__ import annotations

import re

from torch_mlir import ir

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([0-9,]+)\],f32>$")


def f32_shape(value: ir.Value) -> list[int] | None:
    match = _VTENSOR.match(str(value.type))
    return [int(d) for d in match.group(1).split(",")] if match else None


def torch_constant(value: ir.Value, kind: str):
    """The value of a `torch.constant.<kind>` (int or bool), else None."""
    owner = value.owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    if not isinstance(owner, ir.Operation) or owner.name != f"torch.constant.{kind}":
        return None
    attribute = owner.attributes["value"]
    return bool(ir.BoolAttr(attribute).value) if kind == "bool" else ir.IntegerAttr(attribute).value


def int_pair(value: ir.Value) -> tuple[int, int] | None:
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    if not isinstance(owner, ir.Operation) or owner.name != "torch.prim.ListConstruct" or len(owner.operands) != 2:
        return None
    pair = tuple(torch_constant(v, "int") for v in owner.operands)
    return pair if None not in pair else None


def is_none(value: ir.Value) -> bool:
    return owner_named(value, "torch.constant.none") is not None


def builtin_tensor(*dims: int, element: str = "f32") -> str:
    """The MLIR text of a static builtin tensor type: `tensor<2x3xf32>`."""
    return f"tensor<{'x'.join(map(str, dims))}x{element}>"


def located(lines: list[str], location: str) -> str:
    """A function's lines joined, each op written on one line, or the line that closes
    an op's region with its result type (`  } -> ...`), carrying `location` (the
    replaced op's, printed), so that IREE's dispatches name the torch op they compute."""
    def ends_op(line: str) -> bool:
        return (line.startswith("  %") and not line.endswith("{") and "linalg.reduce" not in line) or \
            line.startswith("  } ->")

    return "\n".join(f"{line} {location}" if location and ends_op(line) else line for line in lines)


def ops_named(op: ir.Operation, name: str) -> list[ir.Operation]:
    """The ops of that name nested in `op`, in order."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                if child.name == name:
                    found.append(child)
                found.extend(ops_named(child, name))
    return found


def owner_named(value: ir.Value, name: str) -> ir.Operation | None:
    """The op of that name that defines `value`, else None."""
    owner = getattr(value.owner, "operation", value.owner)
    return owner if isinstance(owner, ir.Operation) and owner.name == name else None


def _static_sizes(value: ir.Value) -> list[int]:
    """The sizes of a static `!torch.vtensor` value."""
    return [int(d) for d in re.match(r"^!torch\.vtensor<\[([0-9,]+)\]", str(value.type)).group(1).split(",")]


def _builtin(value: ir.Value, element: ir.Type) -> ir.Value:
    shape = _static_sizes(value)
    return ir.Operation.create("torch_c.to_builtin_tensor", operands=[value],
                               results=[ir.RankedTensorType.get(shape, element)]).results[0]


def call_private_function(module: ir.Operation, op: ir.Operation, name: str, text: str, operands: list[ir.Value],
                          elements: list[ir.Type]) -> None:
    """Replace `op` (one float32 result) with a call of the private function `name`
    (defined from `text` if the module lacks it) on `operands` cast to builtin tensors
    of the given element types; `torch_c` casts around the call."""
    call_in_place_of(module, op, name, text, operands, elements, [op.results[0]])
    op.erase()


def call_in_place_of(module: ir.Operation, before: ir.Operation, name: str, text: str, operands: list[ir.Value],
                     elements: list[ir.Type], replaced: list[ir.Value]) -> None:
    """Call the private function `name` (defined from `text` if the module lacks it)
    just before `before`, on `operands` cast to builtin tensors of the given element
    types; its float32 results, cast back, take the uses of `replaced`, in order."""
    # torch_c (Torch-MLIR's TorchConversion dialect) has no Python registration: its
    # casts are made in generic form, which IREE's parser reads as its own ops.
    module.context.allow_unregistered_dialects = True
    if name not in ir.SymbolTable(module):  # the module's symbols, read in C++: one call per matmul
        parsed = ir.Module.parse(text)  # kept alive until its function is moved
        function = parsed.body.operations[0].operation
        function.detach_from_parent()
        module.regions[0].blocks[0].append(function)
    with ir.InsertionPoint(before), before.location:
        result_types = [ir.RankedTensorType.get(_static_sizes(value), ir.F32Type.get()) for value in replaced]
        builtins = [_builtin(value, element) for value, element in zip(operands, elements)]
        call = ir.Operation.create("func.call", operands=builtins, results=result_types,
                                   attributes={"callee": ir.FlatSymbolRefAttr.get(name)})
        backs = [ir.Operation.create("torch_c.from_builtin_tensor", operands=[result], results=[value.type])
                 for result, value in zip(call.results, replaced)]
    for value, back in zip(replaced, backs):
        value.replace_all_uses_with(back.results[0])
