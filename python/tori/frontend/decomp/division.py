"""Integer negation and division, exact for every int64, and never a trap; float
floor division with eager's special values.

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

Float floor division is eager's (c10's div_floor_floating, Python's semantics):
(a - fmod(a, b)) / b, one less where the remainder's sign differs from the divisor's,
rounded to the nearest integer; IREE's floor(a / b) gave inf for inf // 3 (eager NaN,
as fmod(inf, 3) is) and -0.0 for -5 // inf (eager -1; found by the gradient fuzzer,
remainder's backward floor-divides). And fmod of a finite number by an infinite one
is that number (IREE's was NaN).
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


def _float_fmod(a, b):
    """C's fmod: a finite number modulo an infinite one is that number (IREE's is NaN),
    and a zero result has the dividend's sign (IREE's fmod(-3e38, -3e38) was +0.0, so
    rsqrt of it inf where eager's is -inf; the dynamic-shape fuzzer)."""
    remainder = torch.where(torch.isinf(b) & torch.isfinite(a), a, as_is(aten.fmod.Tensor, a, b))
    return torch.where(remainder == 0, torch.copysign(remainder, a), remainder)


def _float_floor_quotient(a, b):
    mod = _float_fmod(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    floor = torch.where(div != 0, floor, torch.copysign(torch.zeros_like(div), a / b))
    return torch.where(b == 0, a / b, floor)


def _float_operands(x, y):
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point or not isinstance(x, torch.Tensor):
        return None
    y = y if isinstance(y, torch.Tensor) else torch.full_like(x, y, dtype=dtype)
    return x.to(dtype), y.to(dtype)


def _floor_division(x, y):
    operands = _operands(x, y)
    if operands is not None:
        return _floor_quotient(*operands)
    operands = _float_operands(x, y)
    return NotImplemented if operands is None else _float_floor_quotient(*operands)


@register_decomposition(aten.div.Tensor_mode, aten.div.Scalar_mode)
def division_with_rounding(op, x, y, *, rounding_mode=None):
    if rounding_mode == "floor":
        return _floor_division(x, y)
    operands = _operands(x, y) if rounding_mode == "trunc" else None
    return NotImplemented if operands is None else _quotient_and_remainder(*operands)[0]


@register_decomposition(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_division(op, x, y):
    return _floor_division(x, y)


@register_decomposition(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(op, x, y):
    operands = _operands(x, y)
    if operands is not None:
        return _quotient_and_remainder(*operands)[1]
    operands = _float_operands(x, y)
    return NotImplemented if operands is None else _float_fmod(*operands)


@register_decomposition(aten.remainder.Tensor, aten.remainder.Scalar)
def integer_remainder(op, x, y):
    operands = _operands(x, y)
    if operands is None:
        return NotImplemented
    remainder = _quotient_and_remainder(*operands)[1]
    late = (remainder != 0) & ((remainder < 0) != (operands[1] < 0))
    return torch.where(late, remainder + operands[1], remainder)
