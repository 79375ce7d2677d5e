"""tori-row-moments: a layer normalization's mean and variance in one pass over its
rows, and any other mean of whole rows, with each row's values summed in vector lanes.

PyTorch's decomposition of `layer_norm` takes a row's mean, subtracts it, and takes
the mean of the squared differences: two reductions, the second reading what the
first wrote. IREE lowered each to a dispatch whose loop adds a vector of 16 values
into one scalar accumulator, 16 dependent scalar additions per vector (IREE keeps
floating-point reductions in order at its default optimization level); DeiT-small at
8 images spent 10.3 ms a call in those two dispatches (`tori profile`,
docs/performance.md). Here each row is viewed as [C/8, 8] and summed over its first
dimension: eight lanes of float64 sums of the values and of their squares (a float32
value and its square are exact in float64), one vector load, conversion, addition
and FMA per 8 values. The variance is E[x^2] - E[x]^2 in float64, whose cancellation
leaves float32's precision intact for rows whose mean is up to about 10^4 standard
deviations from zero (eager's Welford sums, float32, were further from a float64
reference on rows of mean 3e3 and deviation 1). A mean alone (RMSNorm's mean of
squares) is summed the same way.

The eight lanes of a row are then added by an elementwise op over the rows that
reads each lane as an input of its own: a reduction of [R, 8] to [R] was a dispatch
of a few workgroups, and DeiT-small at 8 images ran 2-8% slower with it (one core
waiting on the other 25 times a call) than without the rewrite; elementwise, it
splits like any other op.

Rewrites, for a static float32 x of rank 2 or more whose last dimension C is a
multiple of 8:

    %m = torch.aten.mean.dim %x, [-1], true, none
    %d = torch.aten.sub.Tensor %x, %m, 1
    %s = torch.aten.mul.Tensor %d, %d
    %v = torch.aten.mean.dim %s, [-1], true, none

into a call of a private function of builtin tensors (one per shape) whose two
results take the places of %m and %v; %d stays for the normalization, %s and the
second mean go. The compile runs this pass before IREE for modules compiled only
for CPUs (`lower_for_iree`; `cpu=false` changes nothing).

Never changes: a reduction over another dimension, another dtype or a dynamic
shape, a last dimension that is not a multiple of 8, squares with other uses, and
every other op.

Example:
    %m = torch.aten.mean.dim %x, %dims, %true, %none : !torch.vtensor<[8,197,384],f32>, ... -> !torch.vtensor<[8,197,1],f32>
    ...
    %v = torch.aten.mean.dim %s, %dims2, %true, %none : ... -> !torch.vtensor<[8,197,1],f32>
becomes
    %0 = "torch_c.to_builtin_tensor"(%x) : (...) -> tensor<8x197x384xf32>
    %1:2 = func.call @tori_row_moments_8x197x384_f32(%0) : (...) -> (tensor<8x197x1xf32>, tensor<8x197x1xf32>)
    %m = "torch_c.from_builtin_tensor"(%1#0) ...
    %v = "torch_c.from_builtin_tensor"(%1#1) ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.depthwise_nhwc import _constant, _is_none, _shape, call_in_place_of, ops_named, owner_named
from tori.passes.registry import register_pass

PASS_NAME = "tori-row-moments"
# Float64 lanes of one AVX-512 vector: a row is summed as [C / LANES, LANES].
LANES = 8
# The shortest row rewritten: shorter ones gain less than the second dispatch costs.
MIN_ROW = 64


def _tensor(dims, element: str = "f32") -> str:
    return f"tensor<{'x'.join(map(str, dims))}x{element}>"


def _map(*results: str, dims: int) -> str:
    names = [f"d{i}" for i in range(dims)]
    return f"affine_map<({', '.join(names)}) -> ({', '.join(results)})>"


@dataclass(frozen=True)
class RowMoments:
    """The shape of the rows' input and whether their variance is wanted too: the
    private function depends only on them."""

    shape: tuple[int, ...]
    variance: bool = True

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def name(self) -> str:
        kind = "moments" if self.variance else "mean"
        return f"tori_row_{kind}_{'x'.join(map(str, self.shape))}_f32"

    def function(self) -> str:
        """The private function's MLIR text."""
        *outer, c = self.shape
        r, steps = self.rows, c // LANES
        count = 2 if self.variance else 1
        kept, flat, row = _tensor([*outer, 1]), _tensor([r, c]), _tensor([r])
        lanes, split = _tensor([r, LANES], "f64"), _tensor([r, steps, LANES])

        def each(text: str, times: int = count) -> str:  # a text repeated, comma-separated
            return ", ".join([text] * times)

        lines = [
            f"func.func private @{self.name}(%x: {_tensor(self.shape)}) -> ({each(kept)}) {{",
            "  %zero = arith.constant 0.0 : f64",
            f"  %count = arith.constant {float(c)!r} : f64",
        ]
        rows_value = "%x"
        if len(self.shape) > 2:
            groups = ", ".join(map(str, range(len(outer))))
            lines.append(f"  %x2 = tensor.collapse_shape %x [[{groups}], [{len(outer)}]] : {_tensor(self.shape)} into {flat}")
            rows_value = "%x2"
        squares = ["    %q = arith.mulf %w, %w : f64", "    %n2 = arith.addf %s2, %q : f64"] if self.variance else []
        lines += [
            f"  %x3 = tensor.expand_shape {rows_value} [[0], [1, 2]] output_shape [{r}, {steps}, {LANES}] "
            f": {flat} into {split}",
            f"  %l0 = tensor.empty() : {lanes}",
            f"  %l = linalg.fill ins(%zero : f64) outs(%l0 : {lanes}) -> {lanes}",
            f"  %s:{count} = linalg.generic {{indexing_maps = [{_map('d0', 'd1', 'd2', dims=3)}, "
            f"{each(_map('d0', 'd2', dims=3))}], iterator_types = [\"parallel\", \"reduction\", \"parallel\"]}} "
            f"ins(%x3 : {split}) outs({each('%l')} : {each(lanes)}) {{",
            f"  ^bb0(%v: f32, {', '.join(f'%s{i + 1}: f64' for i in range(count))}):",
            "    %w = arith.extf %v : f32 to f64",
            "    %n1 = arith.addf %s1, %w : f64",
            *squares,
            f"    linalg.yield {', '.join(f'%n{i + 1}' for i in range(count))} : {each('f64')}",
            f"  }} -> ({each(lanes)})",
        ]
        # Each row's lanes are read one by one by an elementwise op, which IREE fuses
        # into the dispatch that reads its results (the normalization): a reduction of
        # the lanes would be a dispatch of its own, of a few workgroups.
        lane_maps = [_map("d0", str(lane), dims=1) for _ in range(count) for lane in range(LANES)]
        lane_values = [f"%s#{k}" for k in range(count) for _ in range(LANES)]
        args = [f"%a{k}_{lane}: f64" for k in range(count) for lane in range(LANES)]
        lines += [
            f"  %e = tensor.empty() : {row}",
            f"  %m:{count} = linalg.generic {{indexing_maps = [{', '.join(lane_maps)}, {each(_map('d0', dims=1))}], "
            f"iterator_types = [\"parallel\"]}} ins({', '.join(lane_values)} : {each(lanes, count * LANES)}) "
            f"outs({each('%e')} : {each(row)}) {{",
            f"  ^bb0({', '.join(args)}, {', '.join(f'%o{k}: f32' for k in range(count))}):",
        ]
        for k in range(count):  # the lanes added pairwise
            level = [f"%a{k}_{lane}" for lane in range(LANES)]
            depth = 0
            while len(level) > 1:
                names = [f"%p{k}_{depth}_{i}" for i in range(len(level) // 2)]
                lines += [f"    {name} = arith.addf {level[2 * i]}, {level[2 * i + 1]} : f64" for i, name in enumerate(names)]
                level, depth = names, depth + 1
            lines.append(f"    %sum{k} = arith.addf {level[0]}, %zero : f64")
        lines += [
            "    %mean = arith.divf %sum0, %count : f64",
            "    %m32 = arith.truncf %mean : f64 to f32",
        ]
        if self.variance:
            lines += [
                "    %squares = arith.divf %sum1, %count : f64",
                "    %mm = arith.mulf %mean, %mean : f64",
                "    %var = arith.subf %squares, %mm : f64",
                "    %var0 = arith.maximumf %var, %zero : f64",
                "    %v32 = arith.truncf %var0 : f64 to f32",
                "    linalg.yield %m32, %v32 : f32, f32",
            ]
        else:
            lines.append("    linalg.yield %m32 : f32")
        every = ", ".join(map(str, range(len(outer) + 1)))
        out_shape = ", ".join(map(str, [*outer, 1]))
        lines += [
            f"  }} -> ({each(row)})",
            *[f"  %r{k} = tensor.expand_shape %m#{k} [[{every}]] output_shape [{out_shape}] : {row} into {kept}"
              for k in range(count)],
            f"  return {', '.join(f'%r{k}' for k in range(count))} : {each(kept)}",
            "}",
        ]
        return "\n".join(lines)


def _last_dim_mean(op: ir.Operation, rank: int) -> bool:
    """Whether `op` (a `torch.aten.mean.dim`) averages its input's last dimension
    alone, keeping it, in the input's dtype."""
    if op.name != "torch.aten.mean.dim" or len(op.operands) != 4:
        return False
    dims = owner_named(op.operands[1], "torch.prim.ListConstruct")
    if dims is None or len(dims.operands) != 1:
        return False
    dim = _constant(dims.operands[0], "int")
    return dim in (-1, rank - 1) and _constant(op.operands[2], "bool") is True and _is_none(op.operands[3])


def _row_mean(op: ir.Operation) -> bool:
    """Whether `op` is a mean of whole rows this pass rewrites: the last dimension of a
    static float32 tensor of rank 2 or more, kept, a multiple of LANES and MIN_ROW long."""
    shape = _shape(op.operands[0]) if op.operands else None
    return (shape is not None and len(shape) >= 2 and 0 not in shape and shape[-1] % LANES == 0
            and shape[-1] >= MIN_ROW and _last_dim_mean(op, len(shape)))


def _single_user(value: ir.Value, name: str) -> ir.Operation | None:
    users = [use.owner for use in value.uses]
    users = [getattr(user, "operation", user) for user in users]
    return users[0] if len(users) == 1 and users[0].name == name else None


def moments_form(mean: ir.Operation) -> tuple[RowMoments, ir.Operation, ir.Operation] | None:
    """For the first mean of a layer normalization's pattern: its form, the mean of
    the squares and the squaring; else None."""
    if not _row_mean(mean):
        return None
    x, shape = mean.operands[0], _shape(mean.operands[0])
    for use in mean.results[0].uses:
        sub = getattr(use.owner, "operation", use.owner)
        if (sub.name != "torch.aten.sub.Tensor" or sub.operands[0] != x or sub.operands[1] != mean.results[0]
                or _constant(sub.operands[2], "int") != 1):
            continue
        for sub_use in sub.results[0].uses:
            square = getattr(sub_use.owner, "operation", sub_use.owner)
            if square.name != "torch.aten.mul.Tensor" or list(square.operands) != [sub.results[0]] * 2:
                continue
            second = _single_user(square.results[0], "torch.aten.mean.dim")
            if second is not None and _last_dim_mean(second, len(shape)):
                return RowMoments(tuple(shape)), second, square
    return None


@register_pass(PASS_NAME)
def row_moments(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Rewrite each layer normalization's two row means into one call of its moments,
    and every other mean of whole rows into a call of its lane sums."""
    if not cpu:
        return
    means = [mean for mean in ops_named(op, "torch.aten.mean.dim") if _row_mean(mean)]
    found = [(mean, moments_form(mean)) for mean in means]
    seconds = [match[1] for _, match in found if match is not None]
    firsts = [(mean, match) for mean, match in found
              if match is not None and not any(mean == second for second in seconds)]
    alone = [mean for mean, match in found
             if match is None and not any(mean == second for second in seconds)]
    for mean, (form, second, square) in firsts:
        call_in_place_of(op, mean, form.name, form.function(), [mean.operands[0]], [ir.F32Type.get()],
                         [mean.results[0], second.results[0]])
        second.erase()
        square.erase()
        mean.erase()
    for mean in alone:
        form = RowMoments(tuple(_shape(mean.operands[0])), variance=False)
        call_in_place_of(op, mean, form.name, form.function(), [mean.operands[0]], [ir.F32Type.get()],
                         [mean.results[0]])
        mean.erase()
