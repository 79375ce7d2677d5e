"""The sign bit: signbit and copysign, which IREE's torch lowering leaves whole and
PyTorch decomposes into prims.signbit (not lowered either). The bit is read through
a bitcast to the same-width integer, so -0.0 and negative NaNs count as negative, as
in eager."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_SAME_WIDTH_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
                   torch.float64: torch.int64}


def _sign_bit(x: torch.Tensor) -> torch.Tensor:
    if x.dtype in _SAME_WIDTH_INT:
        # iree-compile crashes (SIGSEGV) on the bitcast of a 0-d tensor: cast one of rank 1.
        bits = x.reshape(1).view(_SAME_WIDTH_INT[x.dtype]).reshape(()) if x.dim() == 0 else x.view(
            _SAME_WIDTH_INT[x.dtype])
        return bits < 0
    if x.dtype == torch.bool or not x.dtype.is_signed:
        return torch.zeros_like(x, dtype=torch.bool)
    return x < 0


@register_decomposition(aten.signbit.default)
def signbit(op, x):
    if x.dtype not in _SAME_WIDTH_INT and (x.dtype.is_floating_point or x.dtype.is_complex):
        return NotImplemented
    return _sign_bit(x)


@register_decomposition(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(op, a, b):
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()  # copysign of integers is a float
    if dtype not in _SAME_WIDTH_INT:
        return NotImplemented
    magnitude = torch.abs(a.to(dtype))
    if not isinstance(b, torch.Tensor):
        return -magnitude if math.copysign(1.0, b) < 0 else magnitude
    return torch.where(_sign_bit(b.to(dtype)), -magnitude, magnitude)
