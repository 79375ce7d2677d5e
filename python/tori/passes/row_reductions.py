"""tori-row-reductions: sums, means and maxima over the last dimension, and a layer
normalization's mean and variance in one pass over its rows, with each row's values
reduced in vector lanes.

IREE lowered a reduction over the last dimension to a dispatch whose loop folds a
vector of 16 values into one scalar accumulator: 16 dependent scalar additions per
vector (IREE keeps floating-point reductions in order at its default optimization
level), or a tree of shuffles per vector for a maximum. PyTorch's decomposition of
`layer_norm` adds a second such reduction that reads what the first wrote (the
differences from the mean, then the mean of their squares): DeiT-small at 8 images
spent 10.3 ms a call in those two dispatches (`tori profile`, docs/performance.md).

Here each row is viewed as [C/L, L] and reduced over its first dimension, L lanes at
a time: sums in eight float64 lanes (a float32 value and its square are exact in
float64; one vector load, conversion and addition, and an FMA for the squares, per 8
values), maxima in sixteen float32 lanes. A layer normalization's variance is E[x^2]
- E[x]^2 in float64, whose cancellation leaves float32's precision intact for rows
whose mean is up to about 10^4 standard deviations from zero (eager's Welford sums,
float32, were further from a float64 reference on rows of mean 3e3 and deviation 1).

The lanes of a layer normalization's moments are then combined by an elementwise op
over the rows that reads each lane as an input of its own: a reduction of [R, L] to
[R] was a dispatch of a few workgroups, and DeiT-small at 8 images ran 2-8% slower
with it (one core waiting on the other 25 times a call) than without the rewrite;
elementwise, it splits like any other op, and IREE fuses it into no reader (it has
two results).

The lanes of a lone sum, mean or maximum are reduced apart, [R, L] to [R], then a sum's
or mean's finished (the mean scaled by 1/C, exact where C is a power of two, and
truncated to float32) by an elementwise op over the rows. IREE fuses a lone result's
elementwise combine into the op that reads it, which then folded the lanes again for
every value of the row: T5's RMS normalization (the mean of the squares of 128 rows of
512, then `x * rsqrt(mean + eps)`) took 107-119 us a call, 1.0 ms of the encoder's 20
at one sequence, with the lanes reduced 1.1 us for the reduction and 17 for the
normalization (`iree-benchmark-module`, 5 rounds alternating: 17.5-24.4 ms a call
against 15.8-19.0); a decoding step's softmax over 2048 cached positions spent 141 us
a layer in its exponentials, 7 after (`tori profile`). BERT's
softmax maxima at 8 sequences, whose combine IREE had not fused: 58 us a call
elementwise, 36 reduced.

A mean of squares (`x * x` or `x ** 2` read by the mean alone) squares each value in
the call's float64 lanes, reading x: where x is a matmul's result, IREE had fused the
squaring into the matmul's data-tiled epilogue as a second result, and LLVM's code
generation of that executable (two unpacked results) took 2.7 s against 0.5 with one
(the benchmarks' hand-written attention block: its output projection, the residual
add and the next RMS normalization's squares).

Rewrites, for a static float32 x of rank 2 or more whose last dimension C is at least
MIN_ROW and a multiple of L, each reduction keeping that dimension:

    %m = torch.aten.mean.dim %x, [-1], true, none          (a layer normalization's
    %d = torch.aten.sub.Tensor %x, %m, 1                    moments: one call, two
    %s = torch.aten.mul.Tensor %d, %d                       results for %m and %v;
    %v = torch.aten.mean.dim %s, [-1], true, none           %s and %v go)
    %q = torch.aten.pow.Tensor_Scalar %x, 2                 (a mean of squares, as RMS
    torch.aten.mean.dim %q, [-1], true, none                normalization takes it: the
                                                            squares in the call; %q goes)
    torch.aten.mean.dim %y, [-1], true, none               (any other mean)
    torch.aten.sum.dim_IntList %y, [-1], true, none        (a sum)
    torch.aten.amax %y, [-1], true                          (a maximum)

into calls of private functions of builtin tensors (one per kind and shape). The
compile runs this pass before IREE for modules compiled only for CPUs
(`lower_for_iree`; `cpu=false` changes nothing).

Never changes: reductions over other or several dimensions, without keepdim, with a
dtype, of other element types or dynamic shapes, rows shorter than MIN_ROW or not
whole vectors (DeiT's 197 keys: `_LANES`), and every other op.

Example:
    %m = torch.aten.amax %x, %dims, %true : !torch.vtensor<[96,128,128],f32>, ... -> !torch.vtensor<[96,128,1],f32>
becomes
    %0 = "torch_c.to_builtin_tensor"(%x) : (...) -> tensor<96x128x128xf32>
    %1 = func.call @tori_row_max_96x128x128_f32(%0) : (...) -> tensor<96x128x1xf32>
    %m = "torch_c.from_builtin_tensor"(%1) ...
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.builtin_calls import (builtin_tensor, call_in_place_of, f32_shape, is_none, ops_named,
                                      owner_named, torch_constant)
from tori.passes.matching import NoMatch, number, single_user
from tori.passes.registry import register_pass

PASS_NAME = "tori-row-reductions"
# The shortest row rewritten: shorter ones gain less than the second dispatch costs.
MIN_ROW = 64
# The reductions rewritten, by op, and the number of their operands.
_KINDS = {"torch.aten.mean.dim": ("mean", 4), "torch.aten.sum.dim_IntList": ("sum", 4), "torch.aten.amax": ("max", 3)}
_NEGATIVE_INFINITY = "0xFF800000"
# Values reduced side by side, one AVX-512 vector of the accumulator (float64 for sums,
# float32 for maxima). A row must be whole vectors: the vectors of a longer row are a
# slice that IREE copies before it reshapes it (DeiT-small's attention maxima over 197
# keys, 8 images: the copy 9.75 ms a call, the maxima 5.5 ms before).
_LANES = {"moments": 8, "mean": 8, "mean_square": 8, "sum": 8, "max": 16}


def _map(*results: str, dims: int) -> str:
    names = [f"d{i}" for i in range(dims)]
    return f"affine_map<({', '.join(names)}) -> ({', '.join(results)})>"


@dataclass(frozen=True)
class RowReduction:
    """One reduction of rows: the input's shape and the kind, "moments" (a layer
    normalization's mean and variance), "mean", "mean_square" (an RMS normalization's
    mean of the squares, squared in the reduction), "sum" or "max". The private
    function depends only on them."""

    shape: tuple[int, ...]
    kind: str

    @property
    def lanes(self) -> int:
        return _LANES[self.kind]

    @property
    def accumulator(self) -> str:
        return "f32" if self.kind == "max" else "f64"

    @property
    def results(self) -> int:
        return 2 if self.kind == "moments" else 1

    @property
    def name(self) -> str:
        return f"tori_row_{self.kind}_{'x'.join(map(str, self.shape))}_f32"

    def function(self) -> str:
        """The private function's MLIR text."""
        *outer, c = self.shape
        rows, lanes, acc, count = math.prod(outer), self.lanes, self.accumulator, self.results
        kept, flat, row = builtin_tensor(*outer, 1), builtin_tensor(rows, c), builtin_tensor(rows)
        lane_type, split = builtin_tensor(rows, lanes, element=acc), builtin_tensor(rows, c // lanes, lanes)

        def each(text: str, times: int = count) -> str:  # a text repeated, comma-separated
            return ", ".join([text] * times)

        start = f"{_NEGATIVE_INFINITY} : f32" if self.kind == "max" else "0.0 : f64"
        lines = [
            f"func.func private @{self.name}(%x: {builtin_tensor(*self.shape)}) -> ({each(kept)}) {{",
            f"  %start = arith.constant {start}",
        ]
        if self.kind == "moments":
            lines += ["  %zero = arith.constant 0.0 : f64", f"  %count = arith.constant {float(c)!r} : f64"]
        rows_value = "%x"
        if len(self.shape) > 2:
            groups = ", ".join(map(str, range(len(outer))))
            lines.append(f"  %x2 = tensor.collapse_shape %x [[{groups}], [{len(outer)}]] "
                         f": {builtin_tensor(*self.shape)} into {flat}")
            rows_value = "%x2"
        if self.kind == "max":
            step = ["    %n1 = arith.maximumf %s1, %v : f32"]
        elif self.kind == "mean_square":
            step = ["    %w = arith.extf %v : f32 to f64", "    %q = arith.mulf %w, %w : f64",
                    "    %n1 = arith.addf %s1, %q : f64"]
        else:
            step = ["    %w = arith.extf %v : f32 to f64", "    %n1 = arith.addf %s1, %w : f64"]
            if self.kind == "moments":
                step += ["    %q = arith.mulf %w, %w : f64", "    %n2 = arith.addf %s2, %q : f64"]
        lines += [
            f"  %x3 = tensor.expand_shape {rows_value} [[0], [1, 2]] output_shape [{rows}, {c // lanes}, {lanes}] "
            f": {flat} into {split}",
            f"  %l0 = tensor.empty() : {lane_type}",
            f"  %l = linalg.fill ins(%start : {acc}) outs(%l0 : {lane_type}) -> {lane_type}",
            f"  %s:{count} = linalg.generic {{indexing_maps = [{_map('d0', 'd1', 'd2', dims=3)}, "
            f"{each(_map('d0', 'd2', dims=3))}], iterator_types = [\"parallel\", \"reduction\", \"parallel\"]}} "
            f"ins(%x3 : {split}) outs({each('%l')} : {each(lane_type)}) {{",
            f"  ^bb0(%v: f32, {', '.join(f'%s{k + 1}: {acc}' for k in range(count))}):",
            *step,
            f"    linalg.yield {', '.join(f'%n{k + 1}' for k in range(count))} : {each(acc)}",
            f"  }} -> ({each(lane_type)})",
        ]
        lines += self._combine(rows) if self.kind == "moments" else self._reduce_lanes(rows)
        every = ", ".join(map(str, range(len(outer) + 1)))
        out_shape = ", ".join(map(str, [*outer, 1]))
        lines += [
            *[f"  %r{k} = tensor.expand_shape %m#{k} [[{every}]] output_shape [{out_shape}] : {row} into {kept}"
              for k in range(count)],
            f"  return {', '.join(f'%r{k}' for k in range(count))} : {each(kept)}",
            "}",
        ]
        return "\n".join(lines)

    def _reduce_lanes(self, rows: int) -> list[str]:
        """The reduction of a lone result's lanes into %m#0, one float32 value a row: a
        maximum's directly, a sum's float64 lanes then truncated (a mean's scaled by
        1/C)."""
        lanes, acc, c = self.lanes, self.accumulator, self.shape[-1]
        row, lane_type, total = builtin_tensor(rows), builtin_tensor(rows, lanes, element=acc), \
            builtin_tensor(rows, element=acc)
        fold = "arith.maximumf" if self.kind == "max" else "arith.addf"
        name = "%m:1" if self.kind == "max" else "%total"
        lines = [
            f"  %t0 = tensor.empty() : {total}",
            f"  %t1 = linalg.fill ins(%start : {acc}) outs(%t0 : {total}) -> {total}",
            f"  {name} = linalg.generic {{indexing_maps = [{_map('d0', 'd1', dims=2)}, {_map('d0', dims=2)}], "
            f"iterator_types = [\"parallel\", \"reduction\"]}} ins(%s#0 : {lane_type}) outs(%t1 : {total}) {{",
            f"  ^bb0(%lane: {acc}, %sum: {acc}):",
            f"    %next = {fold} %sum, %lane : {acc}",
            f"    linalg.yield %next : {acc}",
            f"  }} -> {total}",
        ]
        if self.kind == "max":
            return lines
        if self.kind in ("mean", "mean_square"):
            lines.append(f"  %scale = arith.constant {1.0 / c!r} : f64")
            finish = ["    %mean = arith.mulf %t, %scale : f64", "    %v32 = arith.truncf %mean : f64 to f32"]
        else:
            finish = ["    %v32 = arith.truncf %t : f64 to f32"]
        return lines + [
            f"  %e = tensor.empty() : {row}",
            f"  %m:1 = linalg.generic {{indexing_maps = [{_map('d0', dims=1)}, {_map('d0', dims=1)}], "
            f"iterator_types = [\"parallel\"]}} ins(%total : {total}) outs(%e : {row}) {{",
            "  ^bb0(%t: f64, %o: f32):",
            *finish,
            "    linalg.yield %v32 : f32",
            f"  }} -> {row}",
        ]

    def _combine(self, rows: int) -> list[str]:
        """The elementwise op over the rows that folds each row's lanes of its moments,
        each lane read as an input of its own, into the mean and the variance."""
        lanes = self.lanes
        row, lane_type = builtin_tensor(rows), builtin_tensor(rows, lanes, element="f64")
        inputs = [(f"%s#{k}", _map("d0", str(lane), dims=1), f"%a{k}_{lane}: f64")
                  for k in range(2) for lane in range(lanes)]
        lines = [
            f"  %e = tensor.empty() : {row}",
            f"  %m:2 = linalg.generic {{indexing_maps = [{', '.join(i[1] for i in inputs)}, "
            f"{_map('d0', dims=1)}, {_map('d0', dims=1)}], iterator_types = [\"parallel\"]}} "
            f"ins({', '.join(i[0] for i in inputs)} : {', '.join([lane_type] * len(inputs))}) "
            f"outs(%e, %e : {row}, {row}) {{",
            f"  ^bb0({', '.join(i[2] for i in inputs)}, %o0: f32, %o1: f32):",
        ]
        names = itertools.count()
        totals = []
        for k in range(2):  # the lanes folded pairwise
            level = [f"%a{k}_{lane}" for lane in range(lanes)]
            while len(level) > 1:
                pairs = [(level[2 * i], level[2 * i + 1]) for i in range(len(level) // 2)]
                level = [f"%f{next(names)}" for _ in pairs]
                lines += [f"    {name} = arith.addf {a}, {b} : f64" for name, (a, b) in zip(level, pairs)]
            totals.append(level[0])
        return lines + [
            f"    %mean = arith.divf {totals[0]}, %count : f64",
            "    %m32 = arith.truncf %mean : f64 to f32",
            f"    %squares = arith.divf {totals[1]}, %count : f64",
            "    %mm = arith.mulf %mean, %mean : f64",
            "    %var = arith.subf %squares, %mm : f64",
            "    %var0 = arith.maximumf %var, %zero : f64",
            "    %v32 = arith.truncf %var0 : f64 to f32",
            "    linalg.yield %m32, %v32 : f32, f32",
            f"  }} -> ({row}, {row})",
        ]


def row_reduction_kind(op: ir.Operation) -> str | None:
    """The kind of reduction `op` is, where this pass rewrites it: over the last
    dimension alone of a static float32 tensor of rank 2 or more, at least MIN_ROW
    long, keeping the dimension, in the input's dtype; else None."""
    kind, operands = _KINDS.get(op.name, (None, 0))
    if kind is None or len(op.operands) != operands:
        return None
    shape = f32_shape(op.operands[0])
    if shape is None or len(shape) < 2 or 0 in shape or shape[-1] < MIN_ROW or shape[-1] % _LANES[kind]:
        return None
    dims = owner_named(op.operands[1], "torch.prim.ListConstruct")
    if dims is None or len(dims.operands) != 1 or torch_constant(dims.operands[0], "int") not in (-1, len(shape) - 1):
        return None
    if torch_constant(op.operands[2], "bool") is not True or (operands == 4 and not is_none(op.operands[3])):
        return None
    return kind


def moments_form(mean: ir.Operation) -> tuple[ir.Operation, ir.Operation] | None:
    """For the first mean of a layer normalization's pattern: the mean of the squared
    differences and the squaring; else None."""
    if row_reduction_kind(mean) != "mean":
        return None
    x = mean.operands[0]
    for use in mean.results[0].uses:
        sub = getattr(use.owner, "operation", use.owner)
        if (sub.name != "torch.aten.sub.Tensor" or sub.operands[0] != x or sub.operands[1] != mean.results[0]
                or torch_constant(sub.operands[2], "int") != 1):
            continue
        for sub_use in sub.results[0].uses:
            square = getattr(sub_use.owner, "operation", sub_use.owner)
            if square.name != "torch.aten.mul.Tensor" or list(square.operands) != [sub.results[0]] * 2:
                continue
            second = single_user(square.results[0], "torch.aten.mean.dim")
            if second is not None and row_reduction_kind(second) == "mean":
                return second, square
    return None


def squared_operand(mean: ir.Operation) -> ir.Operation | None:
    """For a row mean of squares (`x * x` or `x ** 2`, read by the mean alone): the
    squaring; else None."""
    square = owner_named(mean.operands[0], "torch.aten.mul.Tensor") or \
        owner_named(mean.operands[0], "torch.aten.pow.Tensor_Scalar")
    if square is None or single_user(square.results[0]) is None:
        return None
    x = square.operands[0]
    if square.name == "torch.aten.mul.Tensor":
        same = square.operands[1] == x
    else:
        try:
            same = number(square.operands[1]) == 2.0
        except NoMatch:
            same = False
    return square if same and f32_shape(x) == f32_shape(mean.operands[0]) else None


@register_pass(PASS_NAME)
def row_reductions(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Rewrite each layer normalization's two row means into one call of its moments,
    and every other row reduction into a call of its lane form."""
    if not cpu:
        return
    found = [(reduction, kind) for name in _KINDS for reduction in ops_named(op, name)
             if (kind := row_reduction_kind(reduction)) is not None]
    moments = [(mean, match) for mean, kind in found if kind == "mean" and (match := moments_form(mean))]
    seconds = [second for _, (second, _) in moments]
    moments = [(mean, match) for mean, match in moments if not any(mean == second for second in seconds)]
    taken = seconds + [mean for mean, _ in moments]
    alone = [(reduction, kind) for reduction, kind in found if not any(reduction == t for t in taken)]
    for mean, (second, square) in moments:
        form = RowReduction(tuple(f32_shape(mean.operands[0])), "moments")
        call_in_place_of(op, mean, form.name, form.function(), [mean.operands[0]], [ir.F32Type.get()],
                         [mean.results[0], second.results[0]])
        second.erase()
        square.erase()
        mean.erase()
    for reduction, kind in alone:
        square = squared_operand(reduction) if kind == "mean" else None
        x = square.operands[0] if square is not None else reduction.operands[0]
        form = RowReduction(tuple(f32_shape(x)), "mean_square" if square is not None else kind)
        call_in_place_of(op, reduction, form.name, form.function(), [x], [ir.F32Type.get()], [reduction.results[0]])
        reduction.erase()
        if square is not None:
            square.erase()
