"""Integer negation and division, exact for every int64, and never a trap.

Torch-MLIR lowers `neg` of an integer tensor through float32 and `floor_divide`
through float64: -(-2147483649) gave 2147483648 and (2^53 + 1) // 3 gave
3002399751580330, one off (found by `make fuzz`, gradients, seed 2). And the one
integer quotient that overflows, the type's minimum divided by -1, traps on x86: the
module's process dies of SIGFPE (eager's `//` wraps it to the minimum; its
`div(..., rounding_mode="trunc")` traps as well). Here negation is a multiplication
by -1 (wrapping as eager does); division, floor division, remainder and fmod never
divide the minimum by -1; floor division is truncating division corrected by one
where the remainder's sign differs from the divisor's. Division by zero is checked
before (checks.py).
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import as_is, register_decomposition

aten = torch.ops.aten

_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@register_decomposition(aten.neg.default)
def integer_negation(op, x):
    if x.dtype not in _INTEGERS:
        return NotImplemented
    return x * -1


def _operands(x, y):
    """x and y as tensors of their result type, or None where it is not an integer type."""
    dtype = torch.result_type(x, y)
    if dtype not in _INTEGERS or not isinstance(x, torch.Tensor):
        return None
    y = y if isinstance(y, torch.Tensor) else torch.full_like(x, y, dtype=dtype)
    return x.to(dtype), y.to(dtype)


def _quotient_and_remainder(x, y):
    """Truncating quotient and remainder (C's), never dividing the minimum by -1:
    where y is -1 the numerator is 0 and the quotient -x."""
    minus_one = (y == -1).to(y.dtype)
    numerator = x * (1 - minus_one)
    quotient = as_is(aten.div.Tensor_mode, numerator, y, rounding_mode="trunc") - x * minus_one
    return quotient, as_is(aten.fmod.Tensor, numerator, y)


def _floor_quotient(x, y):
    quotient, remainder = _quotient_and_remainder(x, y)
    late = (remainder != 0) & ((remainder < 0) != (y < 0))
    return quotient - late.to(quotient.dtype)


@register_decomposition(aten.div.Tensor_mode, aten.div.Scalar_mode)
def integer_division(op, x, y, *, rounding_mode=None):
    operands = _operands(x, y) if rounding_mode in ("trunc", "floor") else None
    if operands is None:
        return NotImplemented
    if rounding_mode == "floor":
        return _floor_quotient(*operands)
    return _quotient_and_remainder(*operands)[0]


@register_decomposition(aten.floor_divide.default, aten.floor_divide.Scalar)
def integer_floor_division(op, x, y):
    operands = _operands(x, y)
    return NotImplemented if operands is None else _floor_quotient(*operands)


@register_decomposition(aten.fmod.Tensor, aten.fmod.Scalar)
def integer_fmod(op, x, y):
    operands = _operands(x, y)
    return NotImplemented if operands is None else _quotient_and_remainder(*operands)[1]


@register_decomposition(aten.remainder.Tensor, aten.remainder.Scalar)
def integer_remainder(op, x, y):
    operands = _operands(x, y)
    if operands is None:
        return NotImplemented
    remainder = _quotient_and_remainder(*operands)[1]
    late = (remainder != 0) & ((remainder < 0) != (operands[1] < 0))
    return torch.where(late, remainder + operands[1], remainder)
