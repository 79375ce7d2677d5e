"""tori-fuse-layer-norm: layer normalization in the var_mean form that PyTorch's
decomposition of `layer_norm` leaves, or the two-mean form of tori's own float32
decomposition, becomes one `torch.aten.native_layer_norm`, which IREE forms into
fewer dispatches (2 instead of 3 for a [256,128] f32 input).

Rewrites, for x of a float dtype and static shape, normalized over its last n dims:

    %var, %mean = var_mean.correction %x, [trailing n dims], 0 (or 0.0), keepdim=true
    %r = rsqrt(add.Scalar(%var, eps, 1))
    %y = mul.Tensor(sub.Tensor(%x, %mean, 1), %r)
or
    %mean = mean.dim %x, [trailing n dims], keepdim=true
    %c = sub.Tensor(%x, %mean, 1)
    %r = rsqrt(add.Scalar(mean.dim(mul.Tensor(%c, %c), [same dims], keepdim=true), eps, 1))
    %y = mul.Tensor(%c, %r)
    %y = mul.Tensor(%y, %weight)          (optional; weight of the normalized shape)
    %y = add.Tensor(%y, %bias, 1)         (optional; bias of the normalized shape)

into `native_layer_norm(%x, shape, %weight|none, %bias|none, eps)`'s first result.

Never changes: a correction other than 0 (that is not layer norm), reductions over
other dims or without keepdim, weights or biases of another shape or dtype (a
broadcast that is not an affine of the normalized dims), and patterns whose
intermediate values (variance, mean, the normalized tensor) have other users.

Example:
    %var, %mean = torch.aten.var_mean.correction %x, %dims, %int0, %true
    %0 = torch.aten.add.Scalar %var, %float1.0e-05, %int1
    %1 = torch.aten.rsqrt %0
    %2 = torch.aten.sub.Tensor %x, %mean, %int1
    %3 = torch.aten.mul.Tensor %2, %1
becomes
    %3, %_, %_ = torch.aten.native_layer_norm %x, [128], %none, %none, %float1.0e-05
"""

from __future__ import annotations

import logging

from torch_mlir import ir

from tori.passes import matching as m
from tori.passes.matching import NoMatch
from tori.passes.registry import register_pass

log = logging.getLogger("tori.passes.fuse_layer_norm")


def _only_user(value: ir.Value, *names: str) -> ir.Operation:
    found = m.users(value)
    if len(found) != 1 or found[0].name not in names:
        raise NoMatch(f"expected one user, {' or '.join(names)}")
    return found[0]


def _affine_operand(op: ir.Operation, normalized: ir.Value, shape: tuple[int, ...], dtype: str) -> ir.Value:
    """The weight or bias that `op` applies to `normalized`, if it has the normalized shape."""
    lhs, rhs = op.operands[0], op.operands[1]
    other = rhs if lhs == normalized else lhs
    if other == normalized:
        raise NoMatch("affine of itself")
    type_ = m.expect_type(other)
    if type_.shape != shape or type_.dtype != dtype:
        raise NoMatch("affine parameter shape")
    return other


def _trailing_dims(x_type, dims_value: ir.Value) -> int:
    """How many trailing dims a reduction's dims list names (NoMatch for other dims)."""
    dims = sorted(m.normalize_dim(d, x_type.rank) for d in m.constant(dims_value))
    count = len(dims)
    if not count or dims != list(range(x_type.rank - count, x_type.rank)):
        raise NoMatch("not trailing dims")
    return count


def _epsilon(variance: ir.Value) -> tuple[ir.Operation, ir.Operation, float]:
    """rsqrt(variance + eps): the two ops and eps."""
    add_eps = _only_user(variance, "torch.aten.add.Scalar")
    eps = m.number(add_eps.operands[1])
    if m.number(add_eps.operands[2]) != 1 or eps < 0:
        raise NoMatch("eps")
    return add_eps, _only_user(add_eps.result, "torch.aten.rsqrt"), eps


def _moments(reduction: ir.Operation):
    """The ops from the statistics to the normalized tensor, and x, its type, the
    normalized dim count and eps, for either form."""
    x = reduction.operands[0]
    x_type = m.expect_type(x)
    if x_type.dtype not in m.FLOAT_DTYPES:
        raise NoMatch("dtype")
    count = _trailing_dims(x_type, reduction.operands[1])
    if reduction.name == "torch.aten.var_mean.correction":
        if m.number(reduction.operands[2]) != 0 or m.constant(reduction.operands[3]) is not True:
            raise NoMatch("correction or keepdim")
        variance, mean = reduction.results
        add_eps, rsqrt, eps = _epsilon(variance)
        sub = _only_user(mean, "torch.aten.sub.Tensor")
        squares = []
    else:
        if m.constant(reduction.operands[2]) is not True or m.constant(reduction.operands[3]) is not None:
            raise NoMatch("keepdim or dtype")
        mean = reduction.result
        sub = _only_user(mean, "torch.aten.sub.Tensor")
        centered = []  # a square uses the centered tensor twice: each user once
        for user in m.users(sub.result):
            if user not in centered:
                centered.append(user)
        square = next((u for u in centered if u.operands[0] == sub.result and u.operands[1] == sub.result), None)
        if square is None or square.name != "torch.aten.mul.Tensor" or len(centered) != 2:
            raise NoMatch("no square of the centered tensor")
        second = _only_user(square.result, "torch.aten.mean.dim")
        if _trailing_dims(x_type, second.operands[1]) != count or m.constant(second.operands[2]) is not True \
                or m.constant(second.operands[3]) is not None:
            raise NoMatch("variance over other dims")
        add_eps, rsqrt, eps = _epsilon(second.result)
        squares = [square, second]
    if sub.operands[0] != x or sub.operands[1] != mean or m.number(sub.operands[2]) != 1:
        raise NoMatch("centering")
    normalize = next((u for u in m.users(sub.result) if u not in squares), None)
    if normalize is None or normalize.name != "torch.aten.mul.Tensor" or \
            _only_user(rsqrt.result, "torch.aten.mul.Tensor") != normalize:
        raise NoMatch("scaling")
    return [reduction, sub, *squares, add_eps, rsqrt, normalize], x, x_type, count, eps


def _match(reduction: ir.Operation):
    ops, x, x_type, count, eps = _moments(reduction)
    normalize = ops[-1]
    normalized_shape = x_type.shape[-count:]
    weight = bias = None
    last = normalize
    users = m.users(last.result)
    if len(users) == 1 and users[0].name == "torch.aten.mul.Tensor":
        weight = _affine_operand(users[0], last.result, normalized_shape, x_type.dtype)
        last = users[0]
        ops.append(last)
        users = m.users(last.result)
    if len(users) == 1 and users[0].name == "torch.aten.add.Tensor" and m.number(users[0].operands[2]) == 1:
        try:
            bias = _affine_operand(users[0], last.result, normalized_shape, x_type.dtype)
            last = users[0]
            ops.append(last)
        except NoMatch:
            pass
    if m.expect_type(last.result) != x_type:
        raise NoMatch("result type")
    if not m.only_used_by(ops[:-1], ops):
        raise NoMatch("an intermediate value has other users")
    return ops, last, x, normalized_shape, weight, bias, eps


def _rewrite(ops, last: ir.Operation, x: ir.Value, shape, weight, bias, eps: float) -> None:
    x_type = m.expect_type(x)
    stats_type = x_type.with_shape(x_type.shape[:-len(shape)] + (1,) * len(shape))
    with ir.InsertionPoint(last), last.location:
        norm = ir.Operation.create(
            "torch.aten.native_layer_norm",
            results=[ir.Type.parse(t.text()) for t in (x_type, stats_type, stats_type)],
            operands=[x, m.int_list(shape), weight if weight is not None else m.none_constant(),
                      bias if bias is not None else m.none_constant(), m.float_constant(eps)])
    last.result.replace_all_uses_with(norm.results[0])
    m.erase_unused(ops)


@register_pass("tori-fuse-layer-norm")
def fuse_layer_norm(op: ir.Operation, pass_: object) -> None:
    """Rewrite layer norm in var_mean or two-mean form to one native_layer_norm."""
    fused = 0
    starts = ("torch.aten.var_mean.correction", "torch.aten.mean.dim")
    consumed: set[int] = set()  # ops of rewritten patterns (the variance's mean among them), by hash
    for key, reduction in [(hash(child), child) for child in m.walk(op) if child.name in starts]:
        if key in consumed:
            continue
        try:
            matched = _match(reduction)
        except NoMatch as why:
            log.debug("not fused at %s: %s", reduction.location, why)
            continue
        consumed.update(hash(o) for o in matched[0])
        _rewrite(*matched)
        fused += 1
    log.debug("fused %d layer norms", fused)
