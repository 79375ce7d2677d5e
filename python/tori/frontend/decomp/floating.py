"""Floating-point elementwise ops that IREE does not lower (hypot, angle, nextafter,
frexp), written with comparisons, arithmetic and bit casts of the IEEE encoding."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

# dtype -> (integer type of the same width, fraction bits, exponent bits)
_ENCODING = {
    torch.float32: (torch.int32, 23, 8),
    torch.float16: (torch.int16, 10, 5),
    torch.bfloat16: (torch.int16, 7, 8),
}


def in_float32(function):
    """A unary decomposition that computes `function` in float32, as eager's CPU
    kernels do for half precision (the result rounds back); integers and bools give
    float32, the default dtype; float64 and complex are left undecomposed. An empty
    input gives an empty result without computing: iree-compile crashed (SIGFPE) on
    divisions of empty tensors beside 0-d ones."""

    def decompose(op, x):
        if torch.get_default_dtype() != torch.float32 or x.dtype == torch.float64 or x.dtype.is_complex:
            return NotImplemented
        if x.dtype.is_floating_point and x.dtype not in _ENCODING:
            return NotImplemented
        dtype = x.dtype if x.dtype.is_floating_point else torch.float32
        if x.numel() == 0:
            return torch.empty(x.shape, dtype=dtype, device=x.device)
        return function(x.to(torch.float32)).to(dtype)

    return decompose


def _bitcast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # iree-compile crashes (signal 11) on a bit cast of a 0-d tensor; a 1-element one works.
    if t.dim() == 0:
        return t.unsqueeze(0).view(dtype).squeeze(0)
    return t.view(dtype)


@register_decomposition(aten.hypot.default)
def hypot(op, a, b):
    """sqrt(a² + b²) without overflow or underflow in between, as std::hypot: the
    larger magnitude times sqrt(1 + ratio²); infinite if either is, even beside NaN."""
    dtype = torch.result_type(a, b)
    if dtype not in _ENCODING:
        return NotImplemented
    x, y = torch.abs(a.to(torch.float32)), torch.abs(b.to(torch.float32))
    if dtype == torch.float16:  # squares of float16 values stay finite in float32
        result = torch.sqrt(x * x + y * y)
    else:
        x_larger = x > y
        large, small = torch.where(x_larger, x, y), torch.where(x_larger, y, x)
        ratio = small / large
        result = torch.where(large == 0, torch.zeros_like(large), large * torch.sqrt(1 + ratio * ratio))
        result = torch.where(torch.isnan(x) | torch.isnan(y), x + y, result)
    result = torch.where(torch.isinf(x) | torch.isinf(y), torch.full_like(result, math.inf), result)
    return result.to(dtype)


@register_decomposition(aten.angle.default)
def angle(op, x):
    """The argument of a real number: π below zero, else 0; NaN stays NaN; integers
    give the default float type."""
    if x.is_complex():
        return NotImplemented
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    x = x.to(dtype)
    result = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, result)


def _ordered(bits: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    # The encoding as an integer that orders like the values (-0 and +0 both 0).
    return torch.where(bits < 0, -magnitude, magnitude)


@register_decomposition(aten.nextafter.default)
def nextafter(op, a, b):
    """The representable value after a in the direction of b: one step of a's encoding
    as an integer (sign and magnitude: +1 moves away from zero). Zero and order are
    told from the encodings: IREE's float comparisons treat subnormals as zero."""
    if a.dtype not in _ENCODING or b.dtype != a.dtype:
        return NotImplemented
    as_int, fraction_bits, exponent_bits = _ENCODING[a.dtype]
    magnitude_mask = (1 << (fraction_bits + exponent_bits)) - 1
    a, b = torch.broadcast_tensors(a, b)
    bits_a, bits_b = _bitcast(a, as_int), _bitcast(b, as_int)
    magnitude_a, magnitude_b = torch.bitwise_and(bits_a, magnitude_mask), torch.bitwise_and(bits_b, magnitude_mask)
    key_a, key_b = _ordered(bits_a, magnitude_a), _ordered(bits_b, magnitude_b)
    away_from_zero = (key_b > key_a) == (key_a > 0)
    stepped = _bitcast(torch.where(away_from_zero, bits_a + 1, bits_a - 1).to(as_int), a.dtype)
    tiniest = _bitcast(torch.ones_like(bits_a), a.dtype)  # the smallest subnormal
    from_zero = torch.where(key_b > 0, tiniest, -tiniest)
    result = torch.where(magnitude_a == 0, from_zero, stepped)
    result = torch.where(key_a == key_b, b, result)
    return torch.where(torch.isnan(a) | torch.isnan(b), a + b, result)


@register_decomposition(aten.frexp.Tensor)
def frexp(op, x):
    """Mantissa in [0.5, 1) and int32 exponent from the encoding's fields; a subnormal's
    fraction, an exact integer, is decomposed instead (IREE's float arithmetic treats
    subnormals as zero); zero, infinities and NaN come back whole with exponent 0."""
    if x.dtype not in _ENCODING:
        return NotImplemented
    as_int, fraction_bits, exponent_bits = _ENCODING[x.dtype]
    field_mask = (1 << exponent_bits) - 1
    bias = field_mask >> 1

    def fields(t):
        # IREE lowers no shift by a scalar: the field is masked, then divided down.
        bits = _bitcast(t, as_int)
        return bits, torch.bitwise_and(bits, field_mask << fraction_bits) // (1 << fraction_bits)

    bits, field = fields(x)
    fraction = torch.bitwise_and(bits, (1 << fraction_bits) - 1)
    zero = (field == 0) & (fraction == 0)
    subnormal = (field == 0) & (fraction != 0)
    # A subnormal is fraction · 2^(1 - bias - fraction_bits), the sign aside.
    as_integer = torch.where(bits < 0, -fraction, fraction).to(x.dtype)
    bits, field = fields(torch.where(subnormal, as_integer, x))
    shift = torch.where(subnormal, 1 - bias - fraction_bits, 0).to(torch.int32)
    exponent = field.to(torch.int32) - (bias - 1) + shift
    # The exponent field of a value in [0.5, 1) is bias - 1; sign and fraction stay.
    # (Added into the cleared field: IREE lowers no bitwise_or with a scalar.)
    clear = ~(field_mask << fraction_bits)
    mantissa_bits = torch.bitwise_and(bits, _as_signed(clear, as_int)) + ((bias - 1) << fraction_bits)
    mantissa = _bitcast(mantissa_bits.to(as_int), x.dtype)
    whole = zero | (field == field_mask)
    return torch.where(whole, x, mantissa), torch.where(whole, 0, exponent).to(torch.int32)


def _as_signed(value: int, dtype: torch.dtype) -> int:
    # A bit pattern as the signed integer of that width (the mask has the sign bit set).
    width = torch.iinfo(dtype).bits
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value
