"""tori-int8-weight-matmul: a matmul against an int8 weight widened to float32 (weight-only
quantization, torchao's Int8WeightOnlyConfig) reaches IREE as one contraction that
reads the int8 weight and widens each element as it multiplies.

As `mm(x, permute(convert(w_int8, f32)))`, IREE formed a dispatch of its own for the
widening: every call wrote the float32 weight out and the matmul read it back (with
data tiling, packed as well), so a decoding step read 5x the int8 weight's bytes and
took longer than the float32 model's (docs/quantization.md). As one `linalg.generic`
over [M, N] x [K] with `arith.sitofp` on the weight inside, the weight is read once,
as int8. The weight is transposed to [K, N] first, so that the contraction runs
along N in vector lanes: a 32000x512 matvec took 2.43 ms reading [N, K] rows, 0.54
ms reading [K, N] (one thread; float32's 2.1 ms). For a resident weight IREE hoists
the transpose into the module's initializer: it runs once.

Rewrites: `torch.aten.mm` of a static [M, K] float32 matrix and
`torch.aten.permute([1, 0])` of `torch.prims.convert_element_type(w, float32)` (or
the two the other way round) with `w` a static [N, K] int8 tensor, into a call of a
private function of builtin tensors (one per shape), `torch_c` casts around the
call. IREE would fold the transpose back into the contraction's indexing map: the
code generation rule for graphs with such matmuls turns its transpose propagation
off (targets/codegen.py). The compile runs this pass
before IREE whatever the pipeline (`lower_for_iree`).

Never changes: other matmuls, widenings of other integer types, and dynamic shapes.

Example:
    %c = torch.prims.convert_element_type %w, %int6 : !torch.vtensor<[256,512],si8>, !torch.int -> !torch.vtensor<[256,512],f32>
    %t = torch.aten.permute %c, %dims : !torch.vtensor<[256,512],f32>, !torch.list<int> -> !torch.vtensor<[512,256],f32>
    %y = torch.aten.mm %x, %t : !torch.vtensor<[1,512],f32>, !torch.vtensor<[512,256],f32> -> !torch.vtensor<[1,256],f32>
becomes
    %y0 = func.call @tori_int8_weight_mm_1x512x256(%x0, %w0) : (tensor<1x512xf32>, tensor<256x512xi8>) -> tensor<1x256xf32>
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.depthwise_nhwc import _int_pair, call_private_function, ops_named, owner_named
from tori.passes.registry import register_pass

PASS_NAME = "tori-int8-weight-matmul"

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([0-9,]+)\],(f32|si8)>$")


def _typed_shape(value: ir.Value) -> tuple[list[int], str] | None:
    match = _VTENSOR.match(str(value.type))
    return ([int(d) for d in match.group(1).split(",")], match.group(2)) if match else None


@dataclass(frozen=True)
class Int8WeightMatmul:
    m: int
    k: int
    n: int

    @property
    def name(self) -> str:
        return f"tori_int8_weight_mm_{self.m}x{self.k}x{self.n}"

    def function(self) -> str:
        m, k, n = self.m, self.k, self.n
        return "\n".join([
            f"func.func private @{self.name}(%x: tensor<{m}x{k}xf32>, %w: tensor<{n}x{k}xi8>) -> tensor<{m}x{n}xf32> {{",
            "  %zero = arith.constant 0.0 : f32",
            f"  %t0 = tensor.empty() : tensor<{k}x{n}xi8>",
            f"  %t = linalg.transpose ins(%w : tensor<{n}x{k}xi8>) outs(%t0 : tensor<{k}x{n}xi8>) permutation = [1, 0]",
            f"  %e = tensor.empty() : tensor<{m}x{n}xf32>",
            f"  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>",
            "  %y = linalg.generic {indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (k, n)>, "
            "affine_map<(m, n, k) -> (m, n)>], iterator_types = [\"parallel\", \"parallel\", \"reduction\"]} "
            f"ins(%x, %t : tensor<{m}x{k}xf32>, tensor<{k}x{n}xi8>) outs(%f : tensor<{m}x{n}xf32>) {{",
            "  ^bb0(%a: f32, %b: i8, %acc: f32):",
            "    %bf = arith.sitofp %b : i8 to f32",
            "    %p = arith.mulf %a, %bf : f32",
            "    %s = arith.addf %acc, %p : f32",
            "    linalg.yield %s : f32",
            f"  }} -> tensor<{m}x{n}xf32>",
            f"  return %y : tensor<{m}x{n}xf32>",
            "}",
        ])


def int8_weight_of(value: ir.Value) -> ir.Value | None:
    """The [N, K] tensor that `value` transposes and widens, in either order
    (`permute(convert(w))` or `convert(permute(w))`), else None."""
    first = owner_named(value, "torch.aten.permute") or owner_named(value, "torch.prims.convert_element_type")
    if first is None:
        return None
    second_name = "torch.prims.convert_element_type" if first.name == "torch.aten.permute" else "torch.aten.permute"
    second = owner_named(first.operands[0], second_name)
    if second is None:
        return None
    permute = first if first.name == "torch.aten.permute" else second
    if _int_pair(permute.operands[1]) != (1, 0):
        return None
    return second.operands[0]


def matmul_form(op: ir.Operation) -> tuple[Int8WeightMatmul, ir.Value] | None:
    """The form of a `torch.aten.mm` this pass rewrites and its int8 weight, else None."""
    if op.name != "torch.aten.mm":
        return None
    x, operand = op.operands
    weight = int8_weight_of(operand)
    if weight is None:
        return None
    lhs, rhs, out = _typed_shape(x), _typed_shape(weight), _typed_shape(op.results[0])
    if lhs is None or rhs is None or out is None or lhs[1] != "f32" or rhs[1] != "si8" or out[1] != "f32":
        return None
    (m, k), (n, k_weight) = lhs[0], rhs[0]
    if k != k_weight or out[0] != [m, n]:
        return None
    return Int8WeightMatmul(m, k, n), weight


@register_pass(PASS_NAME)
def int8_weight_matmul(op: ir.Operation, pass_: object) -> None:
    """Rewrite each matmul against a widened int8 weight into a call of its function."""
    for mm in ops_named(op, "torch.aten.mm"):
        found = matmul_form(mm)
        if found is None:
            continue
        form, weight = found
        call_private_function(op, mm, form.name, form.function(), [mm.operands[0], weight],
                              [ir.F32Type.get(), ir.IntegerType.get_signless(8)])
