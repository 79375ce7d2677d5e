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

Never changes: a `where` of a condition computed in the graph (IREE fuses the
comparison with it), or of non-float results.

Example:
    %0 = torch.aten.where.self %arg3, %a, %b : !torch.vtensor<[1,1,1,19],i1>, ... -> !torch.vtensor<[1,1,1,19],f32>
becomes
    %0 = torch.aten.where.self %arg3, %a, %b : ...
    %1 = "torch_c.to_builtin_tensor"(%0) : (...) -> tensor<1x1x1x19xf32>
    %2 = "util.optimization_barrier"(%1) : (tensor<1x1x1x19xf32>) -> tensor<1x1x1x19xf32>
    %3 = "torch_c.from_builtin_tensor"(%2) : (...) -> !torch.vtensor<[1,1,1,19],f32>
    (the users of %0 read %3)
"""

from __future__ import annotations

from torch_mlir import ir

from tori.passes.matching import FLOAT_DTYPES, behind_barrier, tensor_type, walk
from tori.passes.registry import register_pass

PASS_NAME = "tori-materialize-masks"


@register_pass(PASS_NAME)
def materialize_masks(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Compute float tensors selected by boolean graph inputs in dispatches of their own."""
    if not cpu:
        return
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
