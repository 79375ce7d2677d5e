"""tori-erf-polynomial: `erf` on the CPU as one polynomial, without a division.

IREE lowers `math.erf` (MLIR's approximation) to rational functions on three intervals
of |x|: per vector a division and a select of each coefficient among the intervals.
GELU (`x / 2 * (1 + erf(x / sqrt(2)))`, DeiT's, ViT's, BERT's and ConvNeXt's) then
spends more on its `erf` than on its memory: DeiT-small's MLP at 8 images (1576x1536
values, 12 layers) 13 ms a call more in the first matmul's dispatch with GELU fused in
than the matmul alone. Here `erf(x) = x * p(u)`, x clamped to [-CLAMP, CLAMP], with p a
polynomial of degree 16 in u = x^2 * 2 / CLAMP^2 - 1 (Horner, `math.fma`), and +-1 for
|x| >= CLAMP: 20 vector ops, no division, no select of coefficients.

p is a least-squares fit of erf(x) / x at Chebyshev nodes of x^2 in [0, CLAMP^2],
rounded to float32 (numpy, float64). Evaluated in float32 with fused multiply-adds
over 500,000 points in [-5, 5] and down to 1e-30: at most 1.4e-7 from erf (eager's
`torch.erf`, rounded to nearest: 6.0e-8; IREE's own approximation 2.5e-7), at most
2.2e-7 relative below |x| = 1 (IREE's: 2.1e-7). erf(+-inf) = +-1, erf(-0) = -0, NaN
stays NaN (the clamp's `minimumf`/`maximumf` propagate it).

Rewrites each `torch.aten.erf` of a static float32 tensor (rank 1 or more) into a call
of a private function (one per shape) holding one elementwise `linalg.generic`; IREE
fuses it with the ops around it. `cpu=false` (a module for a GPU target) changes
nothing.
"""

from __future__ import annotations

import struct

from torch_mlir import ir

from tori.passes.builtin_calls import builtin_tensor, call_private_function, f32_shape, located, ops_named
from tori.passes.registry import register_pass

PASS_NAME = "tori-erf-polynomial"
# |x| from which erf(x) is +-1 (erf(3.8) = 1 - 7.7e-8, 0.99999994 in float32)
CLAMP = 3.8
# u = x^2 * SCALE - 1, in [-1, 1]
SCALE = 0.13850416243076324
# p's coefficients, u^0 first
COEFFICIENTS = (
    0.3721076250076294, -0.18564091622829437, 0.13774017989635468, -0.11119735240936279, 0.09082306176424026,
    -0.07237771898508072, 0.0550985224545002, -0.039646293967962265, 0.026666713878512383,
    -0.016482297331094742, 0.009709891863167286, -0.005884428042918444, 0.0030002156272530556,
    -0.0008645352208986878, 0.0004172619082964957, -0.0005171063239686191, 0.0002050570910796523,
)


def _f32(value: float) -> str:
    """An exact float32 constant: its bits."""
    return f"0x{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"


def erf_function(shape: list[int]) -> tuple[str, str]:
    """The name and MLIR text of the function computing erf over a float32 tensor of `shape`."""
    tensor = builtin_tensor(*shape)
    name = f"tori_erf_{'x'.join(map(str, shape))}_f32"
    dims = ", ".join(f"d{i}" for i in range(len(shape)))
    identity = f"affine_map<({dims}) -> ({dims})>"
    parallel = ", ".join(['"parallel"'] * len(shape))
    constants = [f"    %c{k} = arith.constant {_f32(c)} : f32" for k, c in enumerate(COEFFICIENTS)]
    last = len(COEFFICIENTS) - 1
    horner = [f"    %h{last - 1} = math.fma %c{last}, %u, %c{last - 1} : f32"] + [
        f"    %h{k} = math.fma %h{k + 1}, %u, %c{k} : f32" for k in range(last - 2, -1, -1)]
    lines = [
        f"func.func private @{name}(%x: {tensor}) -> {tensor} {{",
        f"  %e = tensor.empty() : {tensor}",
        f"  %y = linalg.generic {{indexing_maps = [{identity}, {identity}], iterator_types = [{parallel}]}} "
        f"ins(%x : {tensor}) outs(%e : {tensor}) {{",
        "  ^bb0(%v: f32, %o: f32):",
        f"    %hi = arith.constant {_f32(CLAMP)} : f32",
        f"    %lo = arith.constant {_f32(-CLAMP)} : f32",
        f"    %scale = arith.constant {_f32(SCALE)} : f32",
        f"    %minus_one = arith.constant {_f32(-1.0)} : f32",
        f"    %one = arith.constant {_f32(1.0)} : f32",
        *constants,
        "    %above = arith.maximumf %v, %lo : f32",
        "    %clamped = arith.minimumf %above, %hi : f32",
        "    %t = arith.mulf %clamped, %clamped : f32",
        "    %u = math.fma %t, %scale, %minus_one : f32",
        *horner,
        "    %r = arith.mulf %clamped, %h0 : f32",
        "    %magnitude = math.absf %v : f32",
        "    %saturated = arith.cmpf oge, %magnitude, %hi : f32",
        "    %sign = math.copysign %one, %v : f32",
        "    %result = arith.select %saturated, %sign, %r : f32",
        "    linalg.yield %result : f32",
        f"  }} -> {tensor}",
        f"  return %y : {tensor}",
        "}",
    ]
    return name, "\n".join(lines)


@register_pass(PASS_NAME)
def erf_polynomial(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Rewrite each static float32 `torch.aten.erf` into a call of `erf_function`'s
    function (`cpu=false`: nothing changes)."""
    if not cpu:
        return
    for erf in ops_named(op, "torch.aten.erf"):
        shape = f32_shape(erf.results[0])
        if shape is None:
            continue
        name, text = erf_function(shape)
        call_private_function(op, erf, name, located(text.split("\n"), str(erf.location)), [erf.operands[0]],
                              [ir.F32Type.get()])
