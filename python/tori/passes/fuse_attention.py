"""tori-fuse-attention: attention written out op by op, as AOTAutograd leaves it,
becomes one `torch.aten.scaled_dot_product_attention`, which IREE lowers to its
fused attention kernel (one dispatch instead of two matmuls, a softmax and copies).

Rewrites, for q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev] of one float dtype, static shapes:

    bmm(q', k')            q' = q or mul.Scalar(q, c); k' = k transposed in its last
                           two dims (permute/transpose.int, or any [B,H,E,S] tensor,
                           then transposed back), each optionally mul.Scalar(., c)
    view to [B,H,L,S]
    div.Scalar / mul.Scalar by a constant                     (optional)
    add.Tensor(., mask) | where.self(bool, -inf, .) | where.self(bool, ., -inf)  (optional)
    _softmax over the last dim (half_to_float false), optionally followed by
        the safe-softmax fix-up where(all(eq(scores, -inf)), 0, softmax)
    bmm(probs, v), view to [B,H,L,Ev]

Each bmm operand may be reached through the view(clone(expand(.))) chain that
`aten.matmul`'s decomposition puts around a 4-d tensor. The product of all scale
factors becomes SDPA's `scale`; a mask of lower rank is viewed to rank 4.

Never changes: a pattern whose intermediate values have other users, dynamic or
mismatched shapes, broadcast (GQA) batch dims, a softmax over another dim, an
additive mask of another dtype, a where with any value but -inf, and a safe-softmax
fix-up unless no row can be fully masked (no mask, or a literal mask with a finite
entry in every row): IREE's attention kernel does not zero fully masked rows.

Example (the q/k/v view/expand chains elided):
    %s = torch.aten.bmm %q, %kt : ... -> !torch.vtensor<[8,64,64],f32>
    %s4 = torch.aten.view %s, ... -> !torch.vtensor<[2,4,64,64],f32>
    %d = torch.aten.div.Scalar %s4, %float5.656 ...
    %p = torch.aten._softmax %d, %int-1, %false ...
    %o = torch.aten.bmm %p3, %v3 ... ; %o4 = torch.aten.view %o, ...
becomes
    %o4 = torch.aten.scaled_dot_product_attention %q4, %k4, %v4, %none, %float0, %false, %float0.1768, %false
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch_mlir import ir

from tori.config import FUSED_ATTENTION_PASS
from tori.passes import matching as m
from tori.passes.matching import NoMatch
from tori.passes.registry import register_pass

log = logging.getLogger("tori.passes.fuse_attention")

_NEG_INF = float("-inf")


@dataclass
class _Match:
    ops: list[ir.Operation] = field(default_factory=list)  # everything the rewrite replaces
    scale: float = 1.0
    mask: ir.Value | None = None
    mask_kind: str = "none"  # none, additive, keep (bool: True attends), drop (bool: True masks)
    safe_softmax: bool = False


def _batched(value: ir.Value, match: _Match, rank: int = 4) -> ir.Value:
    """The rank-`rank` tensor a bmm operand was collapsed from: through view, then
    optionally clone and expand (that expands nothing), as `aten.matmul` decomposes."""
    view = m.expect(value, "torch.aten.view")
    flat = m.expect_type(value)
    source = view.operands[0]
    shape = m.expect_type(source).shape
    if len(shape) != rank or shape[-2:] != flat.shape[-2:] or math.prod(shape[:-2]) != flat.shape[0]:
        raise NoMatch("view is not a collapse of batch dims")
    match.ops.append(view)
    clone = m.producer(source, "torch.aten.clone")
    if clone is not None:
        match.ops.append(clone)
        source = clone.operands[0]
    expand = m.producer(source, "torch.aten.expand")
    if expand is not None:
        if m.expect_type(expand.operands[0]).shape != shape:
            raise NoMatch("expand broadcasts")
        match.ops.append(expand)
        source = expand.operands[0]
    return source


def _scaled(value: ir.Value, match: _Match) -> ir.Value:
    """`value` with a mul.Scalar/div.Scalar by a constant peeled off into match.scale."""
    op = m.producer(value, "torch.aten.mul.Scalar", "torch.aten.div.Scalar")
    if op is None:
        return value
    try:
        factor = m.number(op.operands[1])
    except NoMatch:
        return value
    if op.name.endswith("div.Scalar"):
        if factor == 0:
            return value
        factor = 1.0 / factor
    match.scale *= factor
    match.ops.append(op)
    return op.operands[0]


def _untransposed_key(kt: ir.Value, match: _Match) -> ir.Value:
    """k [B,H,S,E] from k' [B,H,E,S]: the input of a last-two-dims transpose, or a new one."""
    kt = _scaled(kt, match)
    rank = m.expect_type(kt).rank
    op = m.producer(kt, "torch.aten.transpose.int", "torch.aten.permute")
    swapped = False
    if op is not None and op.name == "torch.aten.transpose.int":
        dims = sorted(m.normalize_dim(m.constant(d), rank) for d in op.operands[1:3])
        swapped = dims == [rank - 2, rank - 1]
    elif op is not None:
        dims = m.constant(op.operands[1])
        swapped = [m.normalize_dim(d, rank) for d in dims] == [*range(rank - 2), rank - 1, rank - 2]
    if swapped:
        match.ops.append(op)
        return _scaled(op.operands[0], match)
    return _NewTranspose(kt)


class _NewTranspose:
    """A k' that is not a transpose: transposed back when the rewrite is built."""

    def __init__(self, value: ir.Value):
        self.value = value


def _row_can_be_fully_masked(mask: ir.Value, kind: str, folder) -> bool:
    """Whether some row of the mask removes every key; True when it is not a literal."""
    # The backend runs inside Dynamo's FakeTensorMode: real values need it set aside.
    with _disable_current_modes():
        try:
            values = folder.value(mask)
        except Exception:
            return True
        if not isinstance(values, torch.Tensor) or values.dim() == 0 or values.shape[-1] == 0:
            return True
        if kind == "additive":
            attended = values > _NEG_INF
        elif kind == "keep":
            attended = values.bool()
        else:
            attended = ~values.bool()
        return bool((~attended.any(dim=-1)).any())


def _masked(scores: ir.Value, match: _Match, scores_type: m.TensorType) -> ir.Value:
    """`scores` with a mask peeled off into match.mask."""
    add = m.producer(scores, "torch.aten.add.Tensor")
    if add is not None:
        if m.number(add.operands[2]) != 1:
            raise NoMatch("add with alpha")
        lhs, rhs = add.operands[0], add.operands[1]
        inner, mask = (lhs, rhs) if _from_qk(lhs) else (rhs, lhs)
        match.mask, match.mask_kind = mask, "additive"
        match.ops.append(add)
        _check_mask(mask, scores_type, float_dtype=scores_type.dtype)
        return inner
    where = m.producer(scores, "torch.aten.where.self")
    if where is not None:
        cond, on_true, on_false = where.operands
        if m.expect_type(cond).dtype != "i1":
            raise NoMatch("where condition is not bool")
        if _is_neg_inf(on_true):
            match.mask_kind, inner = "drop", on_false
        elif _is_neg_inf(on_false):
            match.mask_kind, inner = "keep", on_true
        else:
            raise NoMatch("where without -inf")
        match.mask = cond
        match.ops.append(where)
        _check_mask(cond, scores_type, float_dtype=None)
        return inner
    return scores


def _from_qk(value: ir.Value) -> bool:
    op = m.producer(value, "torch.aten.div.Scalar", "torch.aten.mul.Scalar")
    if op is not None:
        value = op.operands[0]
    view = m.producer(value, "torch.aten.view")
    return view is not None and m.producer(view.operands[0], "torch.aten.bmm") is not None


def _is_neg_inf(value: ir.Value) -> bool:
    type_ = m.tensor_type(value)
    if type_ is None or type_.rank != 0:
        return False
    try:
        return m.splat_float(value) == _NEG_INF
    except NoMatch:
        pass
    op = m.producer(value, "torch.aten.scalar_tensor")
    if op is None:
        return False
    try:
        return m.number(op.operands[0]) == _NEG_INF
    except NoMatch:
        return False


def _check_mask(mask: ir.Value, scores: m.TensorType, float_dtype: str | None) -> None:
    type_ = m.expect_type(mask)
    if float_dtype is not None and type_.dtype != float_dtype:
        raise NoMatch("mask dtype")
    if type_.rank > scores.rank:
        raise NoMatch("mask rank")
    for dim, full in zip(reversed(type_.shape), reversed(scores.shape)):
        if dim not in (1, full):
            raise NoMatch("mask does not broadcast")


def _compares_with_neg_inf(eq: ir.Operation) -> bool:
    """Whether an `eq` compares with -inf: its number operand, or the 0-d tensor that a
    float comparison with a number becomes (frontend/decomp/comparisons.py)."""
    if eq.name == "torch.aten.eq.Scalar":
        return m.number(eq.operands[1]) == _NEG_INF
    return _is_neg_inf(eq.operands[1])


def _probabilities(probs: ir.Value, match: _Match) -> ir.Value:
    """The scores that a last-dim softmax (optionally the safe form) turns into probs."""
    where = m.producer(probs, "torch.aten.where.self")
    if where is not None:
        cond, zeros, softmax_value = where.operands
        fill = m.producer(zeros, "torch.aten.full_like")
        if fill is not None:
            if fill.operands[0] != softmax_value or m.number(fill.operands[1]) != 0:
                raise NoMatch("safe softmax fill")
        elif m.splat_float(zeros) != 0:  # the full_like, folded by tori-fold-constants
            raise NoMatch("safe softmax fill")
        all_op = m.expect(cond, "torch.aten.all.dim")
        eq = m.expect(all_op.operands[0], "torch.aten.eq.Scalar", "torch.aten.eq.Tensor")
        if not _compares_with_neg_inf(eq) or m.constant(all_op.operands[2]) is not True:
            raise NoMatch("safe softmax condition")
        match.ops.extend([where, all_op, eq] + ([fill] if fill is not None else []))
        match.safe_softmax = True
        probs = softmax_value
    softmax = m.expect(probs, "torch.aten._softmax")
    rank = m.expect_type(probs).rank
    if m.normalize_dim(m.constant(softmax.operands[1]), rank) != rank - 1 or m.constant(softmax.operands[2]):
        raise NoMatch("softmax dim or half_to_float")
    if match.safe_softmax:
        eq_input = next(op for op in match.ops if op.name.startswith("torch.aten.eq.")).operands[0]
        all_op = next(op for op in match.ops if op.name == "torch.aten.all.dim")
        all_dim = m.normalize_dim(m.constant(all_op.operands[1]), rank)
        if eq_input != softmax.operands[0] or all_dim != rank - 1:
            raise NoMatch("safe softmax over other scores")
    match.ops.append(softmax)
    return softmax.operands[0]


def _match(out_view: ir.Operation, folder) -> tuple[_Match, ir.Value, ir.Value | _NewTranspose, ir.Value]:
    match = _Match()
    bmm2 = m.expect(out_view.operands[0], "torch.aten.bmm")
    out_type = m.expect_type(out_view.result)
    if out_type.rank != 4 or out_type.dtype not in m.FLOAT_DTYPES:
        raise NoMatch("output")
    match.ops.extend([out_view, bmm2])
    probs = _batched(bmm2.operands[0], match)
    v = _batched(bmm2.operands[1], match)
    scores = _probabilities(probs, match)
    scores_type = m.expect_type(scores)
    scores = _masked(scores, match, scores_type)
    scores = _scaled(scores, match)
    qk_view = m.expect(scores, "torch.aten.view")
    bmm1 = m.expect(qk_view.operands[0], "torch.aten.bmm")
    if m.expect_type(qk_view.operands[0]).shape != (math.prod(scores_type.shape[:2]), *scores_type.shape[2:]):
        raise NoMatch("scores view")
    match.ops.extend([qk_view, bmm1])
    q = _scaled(_batched(bmm1.operands[0], match), match)
    k = _untransposed_key(_batched(bmm1.operands[1], match), match)

    q_type, v_type = m.expect_type(q), m.expect_type(v)
    k_value = k.value if isinstance(k, _NewTranspose) else k
    k_type = m.expect_type(k_value)
    if isinstance(k, _NewTranspose):
        k_type = k_type.with_shape((*k_type.shape[:2], k_type.shape[3], k_type.shape[2]))
    batch, heads, length, embed = q_type.shape
    keys = k_type.shape[2]
    if (k_type.shape != (batch, heads, keys, embed) or v_type.shape[:3] != (batch, heads, keys)
            or out_type.shape != (batch, heads, length, v_type.shape[3])
            or scores_type.shape != (batch, heads, length, keys)
            or len({q_type.dtype, k_type.dtype, v_type.dtype, out_type.dtype, scores_type.dtype}) != 1):
        raise NoMatch("shapes or dtypes")
    if match.safe_softmax and match.mask is not None and _row_can_be_fully_masked(match.mask, match.mask_kind, folder):
        raise NoMatch("safe softmax with a mask that may remove a whole row")
    if not m.only_used_by(match.ops[1:], match.ops):
        raise NoMatch("an intermediate value has other users")
    return match, q, k, v


def _rewrite(out_view: ir.Operation, match: _Match, q: ir.Value, k, v: ir.Value) -> None:
    with ir.InsertionPoint(out_view), out_view.location:
        if isinstance(k, _NewTranspose):
            kt_type = m.expect_type(k.value)
            k_type = kt_type.with_shape((*kt_type.shape[:2], kt_type.shape[3], kt_type.shape[2]))
            k = m.create("torch.aten.transpose.int", k_type, [k.value, m.int_constant(-2), m.int_constant(-1)]).result
        mask = match.mask
        if mask is not None:
            mask_type = m.expect_type(mask)
            if mask_type.rank < 4:
                shape = (1,) * (4 - mask_type.rank) + mask_type.shape
                mask = m.create("torch.aten.view", mask_type.with_shape(shape), [mask, m.int_list(shape)]).result
                mask_type = m.expect_type(mask)
            if match.mask_kind == "drop":
                mask = m.create("torch.aten.logical_not", mask_type, [mask]).result
        mask_operand = mask if mask is not None else m.none_constant()
        sdpa = m.create("torch.aten.scaled_dot_product_attention", m.expect_type(out_view.result), [
            q, k, v, mask_operand, m.float_constant(0.0), m.bool_constant(False),
            m.float_constant(match.scale), m.bool_constant(False)])
    out_view.result.replace_all_uses_with(sdpa.result)
    m.erase_unused(match.ops)


@register_pass(FUSED_ATTENTION_PASS)
def fuse_attention(op: ir.Operation, pass_: object) -> None:
    """Rewrite attention written out as bmm, scale, mask, softmax, bmm to one scaled_dot_product_attention."""
    from tori.passes.fold_constants import _Folder

    folder = _Folder(op)
    candidates = [child for child in m.walk(op) if child.name == "torch.aten.view"]
    fused = 0
    for view in candidates:
        try:
            match, q, k, v = _match(view, folder)
        except NoMatch as why:
            log.debug("not fused at %s: %s", view.location, why)
            continue
        _rewrite(view, match, q, k, v)
        fused += 1
    log.debug("fused %d attention patterns", fused)
