"""tori-int8-weight-matmul: a matmul against an int8 weight widened to float32 (weight-only
quantization, torchao's Int8WeightOnlyConfig) reaches IREE as one contraction that
reads the int8 weight and widens each element as it multiplies.

As `mm(x, permute(convert(w_int8, f32)))`, IREE formed a dispatch of its own for the
widening: every call wrote the float32 weight out and the matmul read it back (with
data tiling, packed as well), so a decoding step read 5x the int8 weight's bytes and
took longer than the float32 model's (docs/quantization.md). As one `linalg.generic`
with `arith.sitofp` on the weight inside, the weight is read once, as int8.

The contraction reads the weight packed in blocks of 16 rows, [ceil(N/16), K, 16]
(`linalg.pack`, zero rows padding the last block): each block is one contiguous run
of memory whose rows lie in the vector lanes. For a resident weight IREE hoists the
pack into the module's initializer: it runs once. A matvec of [512] by 128 MB of
int8 weights (beyond the caches; 2 threads): 16.2 ms reading a [K, N] copy (the
rows of a vector's lanes a page apart), 5.97 ms reading blocks; reading [N, K] rows,
reduced along K, is slower still (32000x512: 2.77 ms, [K, N] 0.42). And IREE keeps
a pack as it is, where it folded a [K, N] transpose back into the contraction's
indexing map unless its transpose propagation was turned off for the whole module.

A matvec (M = 1: a decoding step) reads the weight in blocks of 64 rows instead, each
block's rows in one tile of IREE's vector code: every step along K reads one whole
64-byte cache line, so the weight streams from memory as one run. IREE's own choice
for such a generic is a tile of 2 blocks of 32 rows (two runs at once, half a line
each per step); the function sets the tile on the contraction (`compilation_info`,
IREE's CPU code generation attributes). 32000x512 int8 weights in a decoding step of
the Llama model in docs/quantization.md (HAL profiler, one thread): 916 us as blocks
of 16 rows (IREE's tile: 4 blocks), 407 us as one block of 64; 131 MB of cold weights
5.9-7.7 ms, 4.3-4.6 with one line per step.

The rewrite is for CPUs: a module compiled for any other target as well keeps its
matmuls (option `cpu=false`, which `lower_for_iree` gives it), since IREE's SPIR-V
code generation failed to tile the blocked contraction to invocations.

Rewrites: `torch.aten.mm` of a static [M, K] float32 matrix (M at most MAX_ROWS) and
`torch.aten.permute([1, 0])` of `torch.prims.convert_element_type(w, float32)` (or
the two the other way round) with `w` a static [N, K] int8 tensor, into a call of a
private function of builtin tensors (one per shape), `torch_c` casts around the
call. The compile runs this pass before IREE whatever the pipeline (`lower_for_iree`).

Never changes: other matmuls, matmuls of more than MAX_ROWS rows, widenings of other
integer types, and dynamic shapes.

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

from tori.passes.builtin_calls import call_private_function, int_pair, ops_named, owner_named
from tori.passes.registry import register_pass
from tori.targets.kernel_configs import cpu_compilation_info

PASS_NAME = "tori-int8-weight-matmul"

BLOCK = 16  # weight rows per block of the packed layout
MATVEC_BLOCK = 64  # a CPU matvec's: one cache line of int8 per step along K


def matvec_tiles(dist: int, block: int) -> str:
    """IREE's CPU tiling of the matvec (b: blocks, i: rows in a block, k: the
    reduction): one block per vector tile, 8 steps of K per unrolled reduction step (16
    measured the same), `dist` blocks per workgroup."""
    return cpu_compilation_info((dist, block, 0), (1, block, 0), (0, 0, 8))


# Above this many rows of x, IREE's data-tiled float32 matmul over the weight widened
# per call is faster (a [M, 512] x [512, 1408] product: M = 128, 1.14 ms as one
# contraction over the int8 blocks against 1.32 widened; M = 256, 2.88 against 1.38).
MAX_ROWS = 128
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
        matvec = m == 1
        block = MATVEC_BLOCK if matvec else BLOCK
        blocks = -(-n // block)
        padded = blocks * block
        packed = f"tensor<{blocks}x{k}x{block}xi8>"
        lines = [
            f"func.func private @{self.name}(%x: tensor<{m}x{k}xf32>, %w: tensor<{n}x{k}xi8>) -> tensor<{m}x{n}xf32> {{",
            "  %zero = arith.constant 0.0 : f32",
            "  %zero_i8 = arith.constant 0 : i8",
            f"  %b0 = tensor.empty() : {packed}",
            f"  %b = linalg.pack %w padding_value(%zero_i8 : i8) inner_dims_pos = [0] inner_tiles = [{block}] into %b0 "
            f": tensor<{n}x{k}xi8> -> {packed}",
        ]
        if matvec:  # x as a vector (no unit loop for IREE to fold away with the tiling)
            out, x_type, attrs = f"tensor<{blocks}x{block}xf32>", f"tensor<{k}xf32>", (
                # at least 4 workgroups where there are blocks enough
                f" attrs = {{compilation_info = {matvec_tiles(max(1, min(8, blocks // 4)), block)}}}")
            maps, loops = ("affine_map<(b, i, k) -> (k)>, affine_map<(b, i, k) -> (b, k, i)>, affine_map<(b, i, k) -> (b, i)>",
                           '"parallel", "parallel", "reduction"')
            lines.append(f"  %v = tensor.collapse_shape %x [[0, 1]] : tensor<1x{k}xf32> into {x_type}")
        else:
            out, x_type, attrs = f"tensor<{m}x{blocks}x{block}xf32>", f"tensor<{m}x{k}xf32>", ""
            maps, loops = ("affine_map<(m, b, i, k) -> (m, k)>, affine_map<(m, b, i, k) -> (b, k, i)>, "
                           "affine_map<(m, b, i, k) -> (m, b, i)>", '"parallel", "parallel", "parallel", "reduction"')
        lines += [
            f"  %e = tensor.empty() : {out}",
            f"  %f = linalg.fill ins(%zero : f32) outs(%e : {out}) -> {out}",
            f"  %y = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{loops}]}} "
            f"ins({'%v' if matvec else '%x'}, %b : {x_type}, {packed}) outs(%f : {out}){attrs} {{",
            "  ^bb0(%a: f32, %v8: i8, %acc: f32):",
            "    %vf = arith.sitofp %v8 : i8 to f32",
            "    %p = arith.mulf %a, %vf : f32",
            "    %s = arith.addf %acc, %p : f32",
            "    linalg.yield %s : f32",
            f"  }} -> {out}",
        ]
        if matvec:
            lines += [f"  %y1 = tensor.collapse_shape %y [[0, 1]] : {out} into tensor<{padded}xf32>",
                      f"  %r = tensor.expand_shape %y1 [[0, 1]] output_shape [1, {padded}] : tensor<{padded}xf32> "
                      f"into tensor<1x{padded}xf32>"]
        else:
            lines.append(f"  %r = tensor.collapse_shape %y [[0], [1, 2]] : {out} into tensor<{m}x{padded}xf32>")
        if padded == n:
            lines.append(f"  return %r : tensor<{m}x{n}xf32>")
        else:
            lines += [f"  %c = tensor.extract_slice %r[0, 0] [{m}, {n}] [1, 1] : tensor<{m}x{padded}xf32> to tensor<{m}x{n}xf32>",
                      f"  return %c : tensor<{m}x{n}xf32>"]
        return "\n".join([*lines, "}"])


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
    if int_pair(permute.operands[1]) != (1, 0):
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
    if k != k_weight or out[0] != [m, n] or m > MAX_ROWS:
        return None
    return Int8WeightMatmul(m, k, n), weight


@register_pass(PASS_NAME)
def int8_weight_matmul(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Rewrite each matmul against a widened int8 weight into a call of its function
    (`cpu`: the module is compiled only for CPUs; else nothing changes)."""
    if not cpu:
        return
    for mm in ops_named(op, "torch.aten.mm"):
        found = matmul_form(mm)
        if found is None:
            continue
        form, weight = found
        call_private_function(op, mm, form.name, form.function(), [mm.operands[0], weight],
                              [ir.F32Type.get(), ir.IntegerType.get_signless(8)])
