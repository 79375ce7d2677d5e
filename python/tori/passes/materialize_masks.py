"""tori-materialize-masks: a float tensor selected by a boolean graph input (an
attention mask, `where(mask, 0, -inf)`) is computed in a dispatch of its own.

IREE fused such a `where` into the attention matmul's data-tiled epilogue and set the
matmul's encoding on the i1 input, whose pack it then built with an i8 padding value:
"'linalg.pack' op expected padding_value has 'i8' but got: 'i1'". The whole graph (a
Llama static-cache decoding step, float32 or weight-only int8) was compiled again
with IREE's global-optimization data tiling, about a second more of its first call,
and that path fuses less. Behind `util.optimization_barrier` the selected float
tensor is what the epilogue reads, and the data-tiled compile succeeds.

Rewrites: the result of `torch.aten.where.self` whose condition is an i1 argument of
the function and whose result is a float tensor passes through the barrier before
its users. The compile runs this pass before IREE for modules compiled only for CPUs
(`lower_for_iree`; `cpu=false` changes nothing).

A boolean constant (a non-splat i1 `torch.vtensor.literal`: a causal mask that
tori-fold-constants computed from `triu(ones(...))`) meets the same encoding: IREE
hoists its data-tiled copy into the initializer, and its encoding executable loads the
i1 buffer as i8 and fails ("'iree_codegen.load_from_buffer' op buffer and tensor shapes
must be compatible and element types must match"); the graph then compiled a second
time on the other path. The constant is stored as bytes instead (ui8, the same values)
and compared with zero where it is read, a comparison IREE fuses into the epilogue.

Never changes: a `where` of a condition computed in the graph (IREE fuses the
comparison with it), or of non-float results; splat boolean constants.

Example:
    %0 = torch.aten.where.self %arg3, %a, %b : !torch.vtensor<[1,1,1,19],i1>, ... -> !torch.vtensor<[1,1,1,19],f32>
becomes
    %0 = torch.aten.where.self %arg3, %a, %b : ...
    %1 = "torch_c.to_builtin_tensor"(%0) : (...) -> tensor<1x1x1x19xf32>
    %2 = "util.optimization_barrier"(%1) : (tensor<1x1x1x19xf32>) -> tensor<1x1x1x19xf32>
    %3 = "torch_c.from_builtin_tensor"(%2) : (...) -> !torch.vtensor<[1,1,1,19],f32>
    (the users of %0 read %3)
and
    %0 = torch.vtensor.literal(dense<[true, false]> : tensor<2xi1>) : !torch.vtensor<[2],i1>
becomes
    %0 = torch.vtensor.literal(dense<[1, 0]> : tensor<2xui8>) : !torch.vtensor<[2],ui8>
    %1 = torch.aten.ne.Scalar %0, %int0 : !torch.vtensor<[2],ui8>, !torch.int -> !torch.vtensor<[2],i1>
"""

from __future__ import annotations

import numpy as np
from torch_mlir import ir

from tori.passes.matching import FLOAT_DTYPES, TensorType, behind_barrier, create, int_constant, tensor_type, walk
from tori.passes.registry import register_pass

PASS_NAME = "tori-materialize-masks"


@register_pass(PASS_NAME)
def materialize_masks(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Compute float tensors selected by boolean graph inputs in dispatches of their own,
    and store boolean constants as bytes."""
    if not cpu:
        return
    for literal in [o for o in walk(op) if o.name == "torch.vtensor.literal"]:
        _as_bytes(literal)
    for where in [o for o in walk(op) if o.name == "torch.aten.where.self"]:
        condition, result = where.operands[0], where.results[0]
        if not isinstance(condition.owner, ir.Block) or getattr(tensor_type(condition), "dtype", None) != "i1" \
                or getattr(tensor_type(result), "dtype", None) not in FLOAT_DTYPES:
            continue
        op.context.allow_unregistered_dialects = True  # util.optimization_barrier, IREE's
        uses = [(use.owner, use.operand_number) for use in result.uses]
        with ir.InsertionPoint.after(where), where.location:
            kept = behind_barrier(result)
        for owner, index in uses:
            owner.operands[index] = kept


def _as_bytes(literal: ir.Operation) -> None:
    """A non-splat i1 literal as a ui8 literal compared with zero."""
    value, attr = literal.results[0], literal.attributes["value"]
    type_ = tensor_type(value)
    if getattr(type_, "dtype", None) != "i1" or not type_.static or not isinstance(attr, ir.DenseElementsAttr) \
            or attr.is_splat:
        return
    element = ir.IntegerType.get_unsigned(8)
    bits = np.array(attr).astype(np.uint8).reshape(type_.shape)
    uses = [(use.owner, use.operand_number) for use in value.uses]
    with ir.InsertionPoint.after(literal), literal.location:
        data = ir.Operation.create(
            "torch.vtensor.literal", results=[ir.Type.parse(TensorType(type_.shape, "ui8").text())],
            attributes={"value": ir.DenseElementsAttr.get(bits, type=element, shape=list(type_.shape))})
        mask = create("torch.aten.ne.Scalar", type_, [data.result, int_constant(0)]).result
    for owner, index in uses:
        owner.operands[index] = mask
    literal.erase()
