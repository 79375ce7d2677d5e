"""Floating-point pow with C's special values, as eager computes it.

IREE computes `pow(x, y)` as exp(y * log(x)), which is NaN for every negative base
(pow(-2, 3) gave NaN, eager -8), for 0^0, NaN^0 and 1^NaN (eager 1), and loses the
sign of -0.0 and -inf. Here: |x|^y by IREE, then the sign for a negative base and an
odd integer exponent, NaN for a negative finite base and a non-integer exponent, and
1 where y is 0, x is 1, or |x| is 1 and y infinite. Integer exponents given as
Python ints are left to IREE, which multiplies; integer tensors to them are
multiplied here. The float exponents 2.0 and 3.0, which eager's CPU kernel computes
as x*x and x*x*x, are those products here too (GPT-2's tanh GELU cubes its input:
the fix-up above cost 20.9 of 692 ms per call at 8 sequences).
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import as_is, register_decomposition

aten = torch.ops.aten


def _pow(x: torch.Tensor, y) -> torch.Tensor:
    y = torch.as_tensor(y, dtype=x.dtype, device=x.device) if not isinstance(y, torch.Tensor) else y
    magnitude = as_is(aten.pow.Tensor_Tensor, torch.abs(x), y)
    negative = (x < 0) | ((x == 0) & (1 / x < 0))  # -0.0 and -inf too
    finite_y = torch.isfinite(y)
    integer = finite_y & (y == torch.trunc(y))
    half = y * 0.5  # exact
    odd = integer & (half != torch.trunc(half))
    result = torch.where(negative & odd, -magnitude, magnitude)
    result = torch.where(negative & ~integer & finite_y & torch.isfinite(x) & (x != 0), torch.nan, result)
    one = (y == 0) | (x == 1) | ((torch.abs(x) == 1) & torch.isinf(y))
    return torch.where(one, torch.ones_like(result), result)


@register_decomposition(aten.pow.Tensor_Tensor)
def pow_tensors(op, x, y):
    dtype = torch.result_type(x, y)
    if not dtype.is_floating_point:
        return NotImplemented
    shape = torch.broadcast_shapes(x.shape, y.shape)
    return _pow(x.to(dtype).expand(shape), y.to(dtype).expand(shape))


# Float exponents that eager computes as products (x*x, x*x*x), with their rounding.
_PRODUCTS = (2.0, 3.0)


@register_decomposition(aten.pow.Tensor_Scalar)
def pow_scalar_exponent(op, x, y):
    if not x.dtype.is_floating_point and x.dtype is not torch.bool and isinstance(y, int) and y >= 0:
        return _integer_power(x, y)
    if not x.dtype.is_floating_point or not isinstance(y, float):
        return NotImplemented
    if y in _PRODUCTS:
        return _integer_power(x, int(y))
    return _pow(x, y)


def _integer_power(x: torch.Tensor, y: int) -> torch.Tensor:
    """x to a non-negative integer power by repeated squaring. An integer tensor wraps
    on overflow as eager's multiplications do (Torch-MLIR lowers integer pow not at all:
    "unimplemented: non-floating point dtype"; torch.square of an int64 tensor is one);
    a float tensor to 2 or 3 gets eager's x*x and x*(x*x) (the same rounding)."""
    if y == 0:
        return torch.ones_like(x)
    result, base = None, x
    while y:
        if y & 1:
            result = base if result is None else result * base
        y >>= 1
        if y:
            base = base * base
    return result
