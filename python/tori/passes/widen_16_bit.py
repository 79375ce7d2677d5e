"""tori-widen-16-bit: bf16 and f16 contractions for a CPU without vector arithmetic
for them compute on float32 operands.

IREE compiles a bf16 matmul for a CPU without bf16 instructions (Zen 3: AVX2 and FMA,
no `avx512bf16`) to one scalar multiply-add per product, the bf16 values widened by
shifts: the wide MLP at batch 64 under bf16 autocast ran 155.5 ms where its float32
model took 1.69 (docs/quantization.md). A 64x512x1024 bf16 matmul compiled for Zen 3
ran 32.4 ms; its operands widened to float32 first, 1.07 ms (the float32 matmul
0.55). IREE folds a widening `arith.extf` back into the contraction (a bf16 x bf16 ->
f32 matmul again: 26.1 ms), so each widened operand passes through
`util.optimization_barrier`; a widened weight (a resident global) is still hoisted
into the module's initializer, since the barrier reads its widened value. The
products are the same and so is the accumulation (IREE's bf16 matmul accumulates in
float32); the result is rounded to the 16-bit type once, as before.

Rewrites: mm, bmm, addmm, baddbmm, matmul, linear and convolution whose result is of
a type named in the options (`bf16`, `f16`: the CPU's missing arithmetic, from its
LLVM features, targets/cpu.py): each operand of that type is converted to float32
and passed through the barrier, the op computes float32, and its result is converted
back. A float32 contraction of operands converted from such a type (tori's
decomposition of a bf16 linear layer under autocast computes so) has those operands
passed through the barrier. The compile runs this pass before IREE for modules compiled only for CPUs
(`lower_for_iree`).

Never changes: contractions of other types, and everything with both options false.

Example (bf16=true):
    %0 = torch.aten.mm %a, %b : !torch.vtensor<[64,512],bf16>, !torch.vtensor<[512,1024],bf16>
           -> !torch.vtensor<[64,1024],bf16>
becomes
    %1 = torch.prims.convert_element_type %a, %int6 : ... -> !torch.vtensor<[64,512],f32>
    %2 = "torch_c.to_builtin_tensor"(%1) : (...) -> tensor<64x512xf32>
    %3 = "util.optimization_barrier"(%2) : (tensor<64x512xf32>) -> tensor<64x512xf32>
    %4 = "torch_c.from_builtin_tensor"(%3) : (...) -> !torch.vtensor<[64,512],f32>
    (the same for %b)
    %9 = torch.aten.mm %4, %8 : ... -> !torch.vtensor<[64,1024],f32>
    %0 = torch.prims.convert_element_type %9, %int15 : ... -> !torch.vtensor<[64,1024],bf16>
"""

from __future__ import annotations

from torch_mlir import ir

from tori.passes.matching import behind_barrier, create, int_constant, producer, tensor_type, walk
from tori.passes.registry import register_pass

PASS_NAME = "tori-widen-16-bit"

CONTRACTIONS = frozenset({"torch.aten.mm", "torch.aten.bmm", "torch.aten.addmm", "torch.aten.baddbmm",
                          "torch.aten.matmul", "torch.aten.linear", "torch.aten.convolution"})
_CONVERSIONS = ("torch.prims.convert_element_type", "torch.aten.to.dtype", "torch.aten._to_copy")
_SCALAR_TYPE = {"f32": 6, "bf16": 15, "f16": 5}  # torch's ScalarType numbers


def _widened(value: ir.Value, float32: ir.Value) -> ir.Value:
    """`value` converted to float32, through IREE's optimization barrier."""
    narrow = tensor_type(value)
    return behind_barrier(create("torch.prims.convert_element_type", type(narrow)(narrow.shape, "f32"),
                        [value, float32]).result)


def _widening_of(value: ir.Value, narrow: set[str]) -> bool:
    """Whether `value` is float32 converted from a tensor of a type in `narrow`."""
    source = producer(value, *_CONVERSIONS)
    return source is not None and getattr(tensor_type(value), "dtype", None) == "f32" \
        and getattr(tensor_type(source.operands[0]), "dtype", None) in narrow


@register_pass(PASS_NAME)
def widen_16_bit(op: ir.Operation, pass_: object, *, bf16: bool = False, f16: bool = False) -> None:
    """Compute bf16 (f16) contractions on float32 operands kept from IREE's folding."""
    narrow = {name for name, wanted in (("bf16", bf16), ("f16", f16)) if wanted}
    if not narrow:
        return
    op.context.allow_unregistered_dialects = True  # util.optimization_barrier, IREE's
    for contraction in [o for o in walk(op) if o.name in CONTRACTIONS]:
        result = tensor_type(contraction.results[0])
        if result is None:
            continue
        if result.dtype == "f32":  # already on widened operands (a decomposition's): kept so
            for index, value in enumerate(contraction.operands):
                if _widening_of(value, narrow):
                    with ir.InsertionPoint(contraction), contraction.location:
                        contraction.operands[index] = behind_barrier(value)
            continue
        if result.dtype not in narrow:
            continue
        with ir.InsertionPoint(contraction), contraction.location:
            float32 = int_constant(_SCALAR_TYPE["f32"])
            operands = [_widened(v, float32) if getattr(tensor_type(v), "dtype", None) == result.dtype else v
                        for v in contraction.operands]
            wide = ir.Operation.create(contraction.name, results=[ir.Type.parse(type(result)(result.shape, "f32").text())],
                                       operands=operands,
                                       attributes={a.name: a.attr for a in contraction.attributes})
            back = create("torch.prims.convert_element_type", result,
                          [wide.result, int_constant(_SCALAR_TYPE[result.dtype])])
        contraction.results[0].replace_all_uses_with(back.result)
        contraction.erase()
