"""tori-packed-attention: the exponentials of an attention's scores are written in the
packed layout of the matmul that reads them, a vector of queries per key, and that
matmul is a `linalg.batch_mmt4d` on tiles of 16 queries by 16 columns.

tori traces an unmasked attention as two matmuls around an unnormalized softmax
(frontend/decomp/attention.py): `e = exp(s - m)` of scores s from scaled queries and
their row maxima m, then `e @ v` and the row sums of `e`. IREE's data tiling packs `e`
for the second matmul in the dispatch that computes it, in tiles of 16 queries by one
key, but vectorizes that dispatch along the keys and stores each vector value by value,
16 scalar stores 197 floats apart (DeiT-small at 8 images, 48 heads of 197 queries and
keys: 1.97 ms a layer, the exponentials alone 0.54). Here the function computes them
as an op over [tiles, keys, queries] reading the scores across their rows; IREE's
tuning spec `PACKED_EXPONENTIALS` (targets/kernel_configs.py, given by the attention
rule of targets/codegen.py) gives that op a vector tile of 16 queries by 16 keys, a
transpose in registers: 0.69-0.78 ms. The row sums are a reduction over the packed
exponentials (vectors along the queries), and the values are packed in tiles of 16
columns: 64 values need no padding, where the column of ones that gave the sums padded
65 to 80 (`e @ [v | 1]` 1.71 ms, `batch_mmt4d` 1.32-1.47).

The packed tiles hold whole vectors of queries, so the rows M must be a multiple of the
lanes: the decomposition pads the queries where this pass runs
(`packed_attention_lanes`), since padding the scores after the first matmul copied
them (0.61 ms a layer).

Rewrites, for static float32 scores s [*lead, M, K] with M a multiple of `lanes`, M at
least MIN_ROWS and K at least MIN_KEYS, and values v [prod(lead), K, N]:

    %d = torch.aten.sub.Tensor %s, %m, 1
    %e = torch.aten.exp %d
    %o = torch.aten.bmm (torch.aten.view (torch.aten.expand %e)), %v
    %t = torch.aten.sum.dim_IntList %e, [-1], true, none         (after the bmm)

into one call of a private function (one per shape and lanes) whose two results replace
%o and %t; %d, %e and the views go. The compile runs it before tori-row-reductions
(which would take the sums) with `lanes` 16, AVX-512's float32 vector, where every
target is a CPU that has it; `lanes=0` changes nothing.

Never changes: exponentials with other users or of another form (a scale or mask
inside), sums before the matmul, dynamic shapes, other element types, rows that are
not whole tiles, fewer rows or keys than the least, and every module when `lanes` is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.builtin_calls import (builtin_tensor, call_in_place_of, f32_shape, is_none, located,
                                      ops_named, owner_named, torch_constant)
from tori.passes.matching import erase_unused, single_user, users
from tori.passes.registry import register_pass

PASS_NAME = "tori-packed-attention"
# The fewest query rows and keys rewritten: a decoding step's few rows keep their sums.
MIN_ROWS = 64
MIN_KEYS = 64


def _dims(values) -> str:
    return ", ".join(map(str, values))


@dataclass(frozen=True)
class PackedAttention:
    """One form: the scores' shape [*lead, M, K], the values' columns N and the lanes
    (the queries of a tile)."""

    scores: tuple[int, ...]
    columns: int
    lanes: int

    @property
    def name(self) -> str:
        return f"tori_packed_attention_{'x'.join(map(str, self.scores))}x{self.columns}_{self.lanes}"

    def function(self, location: str = "") -> str:
        *lead, m, k = self.scores
        lanes, n = self.lanes, self.columns
        batch, tiles, n1 = math.prod(lead), m // lanes, -(-n // lanes)
        rows = batch * tiles
        r = len(lead)
        scores, peaks = builtin_tensor(*self.scores), builtin_tensor(*lead, m, 1)
        split, flat = builtin_tensor(*lead, tiles, lanes, k), builtin_tensor(rows, lanes, k)
        split_peaks, flat_peaks = builtin_tensor(*lead, tiles, lanes, 1), builtin_tensor(rows, lanes)
        packed, packed_flat = builtin_tensor(batch, tiles, k, lanes, 1), builtin_tensor(rows, k, lanes)
        values, packed_values = builtin_tensor(batch, k, n), builtin_tensor(batch, n1, k, lanes, 1)
        out_tiles, out = builtin_tensor(batch, tiles, n1, lanes, lanes), builtin_tensor(batch, m, n)
        sums = builtin_tensor(rows, lanes)
        leading = [[i] for i in range(r)]
        expand_rows = [*leading, [r, r + 1], [r + 2]]  # [*lead, M, x] -> [*lead, M1, L, x]
        to_flat = [list(range(r + 1)), [r + 1], [r + 2]]  # [*lead, M1, L, x] -> [rows, L, x]
        to_flat_peaks = [list(range(r + 1)), [r + 1, r + 2]]

        def groups(g) -> str:
            return "[" + ", ".join("[" + _dims(x) + "]" for x in g) + "]"

        maps = ("affine_map<(q, k, j) -> (q, j, k)>", "affine_map<(q, k, j) -> (q, j)>",
                "affine_map<(q, k, j) -> (q, k, j)>")
        ops = [
            f"func.func private @{self.name}(%s: {scores}, %m: {peaks}, %v: {values}) -> ({out}, {peaks}) {{",
            "  %zero = arith.constant 0.0 : f32",
            f"  %s1 = tensor.expand_shape %s {groups(expand_rows)} output_shape [{_dims([*lead, tiles, lanes, k])}] "
            f": {scores} into {split}",
            f"  %s2 = tensor.collapse_shape %s1 {groups(to_flat)} : {split} into {flat}",
            f"  %m1 = tensor.expand_shape %m {groups(expand_rows)} output_shape [{_dims([*lead, tiles, lanes, 1])}] "
            f": {peaks} into {split_peaks}",
            f"  %m2 = tensor.collapse_shape %m1 {groups(to_flat_peaks)} : {split_peaks} into {flat_peaks}",
            f"  %e0 = tensor.empty() : {packed_flat}",
            f"  %e = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
            f"iterator_types = [\"parallel\", \"parallel\", \"parallel\"]}} "
            f"ins(%s2, %m2 : {flat}, {flat_peaks}) outs(%e0 : {packed_flat}) {{",
            "  ^bb0(%x: f32, %p: f32, %o: f32):",
            "    %d = arith.subf %x, %p : f32",
            "    %y = math.exp %d : f32",
            "    linalg.yield %y : f32",
            f"  }} -> {packed_flat}",
            # The row sums, along the packed keys: a vector of queries per key.
            f"  %t0 = tensor.empty() : {sums}",
            f"  %t1 = linalg.fill ins(%zero : f32) outs(%t0 : {sums}) -> {sums}",
            f"  %t = linalg.reduce ins(%e : {packed_flat}) outs(%t1 : {sums}) dimensions = [1]",
            "    (%a: f32, %b: f32) {",
            "      %ab = arith.addf %a, %b : f32",
            "      linalg.yield %ab : f32",
            "    }",
            f"  %t2 = tensor.expand_shape %t {groups(to_flat_peaks)} output_shape [{_dims([*lead, tiles, lanes, 1])}] "
            f": {sums} into {split_peaks}",
            f"  %t3 = tensor.collapse_shape %t2 {groups(expand_rows)} : {split_peaks} into {peaks}",
            # e @ v on packed tiles: lanes queries by lanes columns.
            f"  %a = tensor.expand_shape %e [[0, 1], [2], [3, 4]] output_shape [{_dims([batch, tiles, k, lanes, 1])}] "
            f": {packed_flat} into {packed}",
            f"  %b0 = tensor.empty() : {packed_values}",
            f"  %b = linalg.pack %v padding_value(%zero : f32) outer_dims_perm = [0, 2, 1] inner_dims_pos = [2, 1] "
            f"inner_tiles = [{lanes}, 1] into %b0 : {values} -> {packed_values}",
            f"  %c0 = tensor.empty() : {out_tiles}",
            f"  %c1 = linalg.fill ins(%zero : f32) outs(%c0 : {out_tiles}) -> {out_tiles}",
            f"  %c = linalg.batch_mmt4d ins(%a, %b : {packed}, {packed_values}) outs(%c1 : {out_tiles}) -> {out_tiles}",
            f"  %y0 = tensor.empty() : {out}",
            f"  %y = linalg.unpack %c inner_dims_pos = [1, 2] inner_tiles = [{lanes}, {lanes}] into %y0 "
            f": {out_tiles} -> {out}",
            f"  return %y, %t3 : {out}, {peaks}",
            "}",
        ]
        return located(ops, location)


_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view", "torch.aten.expand")


def _matmul_of(user: ir.Operation, value: ir.Value) -> tuple[ir.Operation, list[ir.Operation]] | None:
    """The `torch.aten.bmm` that reads `value` as its left operand, directly (`user`)
    or through views and expansions of the same elements each used once, with those
    ops; else None."""
    chain = []
    while user.name != "torch.aten.bmm":
        resized = user.name == "torch.aten.expand" and f32_shape(user.results[0]) != f32_shape(value)
        if user.name not in _VIEWS or resized:
            return None
        chain.append(user)
        value = user.results[0]
        user = single_user(value)
        if user is None:
            return None
    return (user, chain) if user.operands[0] == value else None


def _row_sum(op: ir.Operation, e: ir.Value) -> bool:
    """Whether `op` is `sum(e, [-1], keepdim=True)` in e's dtype."""
    if op.name != "torch.aten.sum.dim_IntList" or op.operands[0] != e or len(op.operands) != 4:
        return False
    dims = owner_named(op.operands[1], "torch.prim.ListConstruct")
    rank = len(f32_shape(e) or [])
    return (dims is not None and len(dims.operands) == 1 and torch_constant(dims.operands[0], "int") in (-1, rank - 1)
            and torch_constant(op.operands[2], "bool") is True and is_none(op.operands[3]))


def attention_form(exp: ir.Operation, lanes: int):
    """(form, operands, the bmm, the sum, ops that go) for an exponential this pass
    rewrites, else None."""
    if exp.name != "torch.aten.exp" or lanes <= 0:
        return None
    shifted = owner_named(exp.operands[0], "torch.aten.sub.Tensor")
    if shifted is None or torch_constant(shifted.operands[2], "int") != 1 or len(users(shifted.results[0])) != 1:
        return None
    scores, peaks = shifted.operands[0], shifted.operands[1]
    shape, peak_shape, e = f32_shape(scores), f32_shape(peaks), exp.results[0]
    if shape is None or len(shape) < 3 or 0 in shape or f32_shape(e) != shape:
        return None
    *lead, m, k = shape
    if peak_shape != [*lead, m, 1] or m % lanes or m < MIN_ROWS or k < MIN_KEYS:
        return None
    readers = users(e)
    sums = [u for u in readers if _row_sum(u, e)]
    others = [u for u in readers if not _row_sum(u, e)]
    if len(sums) != 1 or len(others) != 1:
        return None
    found = _matmul_of(others[0], e)
    if found is None:
        return None
    bmm, chain = found
    if not bmm.is_before_in_block(sums[0]):  # the call, before the bmm, must precede the sum's users
        return None
    values, batch = f32_shape(bmm.operands[1]), math.prod(lead)
    if values is None or len(values) != 3 or values[:2] != [batch, k]:
        return None
    if f32_shape(bmm.results[0]) != [batch, m, values[2]]:
        return None
    return (PackedAttention(tuple(shape), values[2], lanes), [scores, peaks, bmm.operands[1]], bmm, sums[0],
            [*reversed(chain), exp, shifted])


@register_pass(PASS_NAME)
def packed_attention(op: ir.Operation, pass_: object, *, lanes: int = 0) -> None:
    """Rewrite each attention's exponentials, matmul and row sums into one call on
    packed tiles of `lanes` queries (0: nothing changes)."""
    if lanes <= 0:
        return
    for exp in ops_named(op, "torch.aten.exp"):
        found = attention_form(exp, lanes)
        if found is None:
            continue
        form, operands, bmm, total, chain = found
        call_in_place_of(op, bmm, form.name, form.function(str(bmm.location)), operands, [ir.F32Type.get()] * 3,
                         [bmm.results[0], total.results[0]])
        bmm.erase()
        total.erase()
        erase_unused(chain)
