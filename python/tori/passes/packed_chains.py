"""Chains of packed matmuls: a matmul whose result reaches another matmul's left
operand only through elementwise ops (a transformer's MLP: `fc1`, its bias and GELU,
`fc2`) keeps that result in its packed tiles, and the elementwise ops run on the tiles.

tori-packed-matmul (passes/packed_matmul.py) otherwise unpacks `fc1`'s result, and the
dispatch that reads it applies the bias and GELU and packs them again for `fc2`: a pass
over the whole activation between two matmuls. IREE fuses no elementwise op into a
`linalg.mmt4d`'s dispatch (its dispatch formation excludes mmt4d producers), but fuses
them into a contraction written as a `linalg.generic`; a chain's first matmul is that
contraction, its result [M / rows, N / cols, rows, cols], the elementwise ops apply to
the tiles (a bias of N values viewed as [N / cols, 1, cols]), and the second matmul
reads the tiles transposed into its own left operand's layout, which IREE writes from
the first matmul's dispatch. DeiT-small's MLP at 8 images (1576x384 by 384x1536, GELU,
by 1536x384; `iree-benchmark-module`, 2 cores): the first matmul 5.70-5.90 ms and the
unpack, GELU and pack 1.59-1.63 against 6.77-6.81 for the fused dispatch.

The rows of padding tiles (M not a multiple of `rows`) carry the elementwise ops'
values of zero rows through the second matmul into rows its unpack drops; a matmul's
rows do not mix, so they change no kept value.

A chain: a float32 `torch.aten.mm` (the consumer) whose left operand [M, N] is computed
from one or more `torch.aten.mm` results (the leaves, [M, N] each) by ops of
EPILOGUE_OPS, each of result [M, N], whose other tensor operands are scalars (0-d, [1])
or columns' values ([N] or [1, N]); the leaves' results and the ops' results used by
nothing outside the chain, N a multiple of `cols`, and the last op reading two values
of the chain (`_joins_two_values`). Which matmuls the packed forms take
(the same tile rows for all) is tori-packed-matmul's decision; this module finds chains
and rewrites the elementwise ops' types and operands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.builtin_calls import f32_shape
from tori.passes.matching import create, int_list, tensor_type

# Elementwise ops whose results do not depend on where their values lie: a chain's
# ops may run on the packed tiles.
EPILOGUE_OPS = frozenset(f"torch.aten.{name}" for name in (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "add.Scalar", "sub.Scalar", "mul.Scalar",
    "div.Scalar", "pow.Tensor_Scalar", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "relu",
    "gelu", "silu", "sigmoid", "tanh", "erf", "exp", "neg", "hardtanh", "leaky_relu"))


# Ops that pass their tensor operand on unchanged or only regroup its rows (a linear
# layer's [B, S, N] views of its [B * S, N] result, dropout's clone in inference): on
# the tiles they go.
PASSTHROUGH_OPS = frozenset(("torch.aten.view", "torch.aten._unsafe_view", "torch.aten.reshape", "torch.aten.clone"))


@dataclass
class Chain:
    leaves: list[ir.Operation]    # the matmuls whose results stay packed
    epilogue: list[ir.Operation]  # the elementwise ops between them and the consumer
    passthrough: list[ir.Operation]  # views of rows and clones among them
    consumer: ir.Operation        # the matmul that reads them packed
    m: int
    n: int


def chain_into(consumer: ir.Operation) -> Chain | None:
    """The chain whose packed result `consumer` (a `torch.aten.mm`) reads as its left
    operand, else None."""
    left = consumer.operands[0]
    shape = f32_shape(left)
    if shape is None or len(shape) != 2:
        return None
    m, n = shape
    leaves: dict[int, ir.Operation] = {}
    inside: dict[int, ir.Operation] = {}

    def visit(value: ir.Value) -> bool:
        owner = getattr(value.owner, "operation", value.owner)
        shape = f32_shape(value)
        if not isinstance(owner, ir.Operation) or shape is None or shape[-1] != n or math.prod(shape[:-1]) != m:
            return False
        if owner.name == "torch.aten.mm":
            leaves[hash(owner)] = owner
            return True
        if owner.name not in EPILOGUE_OPS | PASSTHROUGH_OPS or len(owner.results) != 1:
            return False
        if hash(owner) in inside:
            return True
        inside[hash(owner)] = owner
        if owner.name in PASSTHROUGH_OPS:
            return visit(owner.operands[0])
        return all(_broadcast_shape(operand, n) is not None or visit(operand) for operand in owner.operands
                   if str(operand.type).startswith("!torch.vtensor"))

    if not visit(left) or not leaves or not _joins_two_values(left, inside, leaves):
        return None
    for op in (*leaves.values(), *inside.values()):
        for use in op.results[0].uses:
            owner = getattr(use.owner, "operation", use.owner)
            if hash(owner) not in inside and (hash(owner) != hash(consumer) or use.operand_number != 0):
                return None
    ops = list(inside.values())
    return Chain(list(leaves.values()), [op for op in ops if op.name in EPILOGUE_OPS],
                 [op for op in ops if op.name in PASSTHROUGH_OPS], consumer, m, n)


def _joins_two_values(value: ir.Value, inside: dict[int, ir.Operation], leaves: dict[int, ir.Operation]) -> bool:
    """Whether the op that computes the consumer's left operand (views and clones
    aside) reads two different values of the chain (GELU's last product, a gated
    layer's): IREE's transpose propagation moves the consumer's transposition of the
    tiles through an op with one such operand into the contraction itself, a new op
    without tori's configuration (T5's ReLU: 6 GFLOP/s, the model 10x slower)."""
    owner = getattr(value.owner, "operation", value.owner)
    while owner.name in PASSTHROUGH_OPS:
        owner = getattr(owner.operands[0].owner, "operation", owner.operands[0].owner)
    if owner.name not in EPILOGUE_OPS:
        return False
    chained = {hash(getattr(v.owner, "operation", v.owner)) for v in owner.operands
               if str(v.type).startswith("!torch.vtensor")} & (set(inside) | set(leaves))
    return len(chained) >= 2


def _broadcast_shape(value: ir.Value, n: int) -> tuple[int, ...] | None:
    """The shape of a float32 operand an epilogue op broadcasts the same over every row
    (a scalar, or one value per column, of rank 4 at most), else None."""
    type_ = tensor_type(value)
    if type_ is None or type_.dtype != "f32" or not type_.static or len(type_.shape) > 4:
        return None
    *lead, last = type_.shape or (1,)
    return type_.shape if all(d == 1 for d in lead) and last in (1, n) else None


def retile(chain: Chain, rows: int, cols: int) -> None:
    """Give the chain's leaves and elementwise ops the packed type [M / rows, N / cols,
    rows, cols], drop its views and clones, and view the operands of one value per
    column as [N / cols, 1, cols]."""
    m1, n1 = -(-chain.m // rows), chain.n // cols
    tiles = ir.Type.parse(f"!torch.vtensor<[{m1},{n1},{rows},{cols}],f32>")
    for op in (*chain.leaves, *chain.epilogue, *chain.passthrough):
        op.results[0].set_type(tiles)
    for op in chain.passthrough:
        op.results[0].replace_all_uses_with(op.operands[0])
    for op in chain.passthrough:
        op.erase()
    for op in chain.epilogue:
        for index, operand in enumerate(op.operands):
            shape = _broadcast_shape(operand, chain.n)
            if shape and shape[-1] == chain.n > 1:
                with ir.InsertionPoint(op), op.location:
                    view = create("torch.aten.view", f"!torch.vtensor<[{n1},1,{cols}],f32>",
                                  [operand, int_list([n1, 1, cols])])
                op.operands[index] = view.result
