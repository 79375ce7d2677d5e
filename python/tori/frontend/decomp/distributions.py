"""Random sampling ops that IREE does not lower (cauchy, geometric, log_normal,
normal of two numbers, randint_like, multinomial), as transforms of the uniform and
standard normal samples that it does: inverse CDFs, counting and top-k.

Eager rejects invalid parameters (sigma <= 0, p outside (0, 1), negative
probabilities); a compiled graph cannot raise, so there those sample as the formula
gives. A generator argument is left to fail, as in `normal.py`.
"""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _uniform_like(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Uniform in [0, 1), drawn in float32 (float64 for float64) as eager draws in
    double or float and rounds once to a 16-bit or integer dtype."""
    return torch.rand(shape, dtype=_draw_dtype(dtype), device=device)


def _draw_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# The widest span of integers a uniform sample in the dtype tells apart.
_SPAN = {torch.float32: 2**24, torch.float64: 2**53}


@register_decomposition(aten.cauchy.default)
def cauchy(op, x, median=0.0, sigma=1.0, *, generator=None):
    """median + sigma * tan(pi * (u - 1/2)): the Cauchy quantile function at u."""
    if generator is not None:
        return NotImplemented
    u = _uniform_like(x.shape, x.dtype, x.device)
    return (median + sigma * torch.tan(math.pi * (u - 0.5))).to(x.dtype)


@register_decomposition(aten.geometric.default)
def geometric(op, x, p, *, generator=None):
    """The number of Bernoulli(p) trials up to the first success: ceil(log(v) /
    log(1 - p)) for v uniform in (0, 1], at least 1. Eager's v may be 0 (then inf);
    here 1 - u keeps it finite. Values past the dtype's range are inf, as in eager."""
    if generator is not None:
        return NotImplemented
    v = 1 - _uniform_like(x.shape, x.dtype, x.device)
    trials = torch.ceil(torch.log(v) / math.log1p(-p))
    # v = 1 gives log(v) = 0 and a count of 0; one trial is the least there is.
    return torch.clamp(trials, min=1).to(x.dtype)


@register_decomposition(aten.log_normal.default)
def log_normal(op, x, mean=1.0, std=2.0, *, generator=None):
    """exp of a normal sample with the given mean and std."""
    if generator is not None:
        return NotImplemented
    z = torch.randn(x.shape, dtype=_draw_dtype(x.dtype), device=x.device)
    return torch.exp(mean + std * z).to(x.dtype)


@register_decomposition(aten.normal.float_float)
def normal_of_numbers(op, mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                      pin_memory=None):
    """mean + std * a standard normal sample of `size`, in `dtype` (the default float
    dtype when none is given)."""
    dtype = dtype or torch.get_default_dtype()
    if generator is not None or not dtype.is_floating_point:
        return NotImplemented
    z = torch.randn(size, dtype=_draw_dtype(dtype), device=device)
    return (mean + std * z).to(dtype)


@register_decomposition(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(op, x, *bounds, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """Integers uniform in [low, high) of x's shape, in `dtype` (x's by default):
    floor(low + u * (high - low)). float32 resolves one in 2^24 of the range, so a
    wider range is left to fail rather than sampled with gaps."""
    low, high = (0, *bounds) if op is aten.randint_like.default else bounds
    dtype = dtype or x.dtype
    device = device or x.device
    draw = _draw_dtype(dtype)
    if high - low > _SPAN[draw]:
        return NotImplemented
    u = torch.rand(x.shape, dtype=draw, device=device)
    # u * span rounds up to span for u just under 1: the clamp keeps high out.
    value = torch.clamp(torch.floor(low + u * (high - low)), max=high - 1)
    return value.to(dtype)


@register_decomposition(aten.multinomial.default)
def multinomial(op, probs, num_samples, replacement=False, *, generator=None):
    """Category indices (int64) drawn by the unnormalized weights in `probs`' last
    dim (one row, or a batch of rows)."""
    if generator is not None or probs.dim() not in (1, 2):
        return NotImplemented
    weights = probs.to(_draw_dtype(probs.dtype))
    rows = weights if weights.dim() == 2 else weights.unsqueeze(0)
    drawn = (_with_replacement if replacement else _without_replacement)(rows, num_samples)
    return drawn if probs.dim() == 2 else drawn.squeeze(0)


def _with_replacement(weights: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Inverse CDF without data-dependent shapes: each draw u in [0, 1) lands in the
    category k with cdf[k - 1] <= u < cdf[k], whose index is the number of
    categories with cdf <= u. A zero-weight category has cdf[k] == cdf[k - 1], so
    no u lands in it."""
    cdf = torch.cumsum(weights, dim=-1)
    # Divided by its own last element, the last cdf is exactly 1 > u: every u lands.
    cdf = cdf / cdf[:, -1:]
    u = torch.rand(weights.shape[0], num_samples, 1, dtype=weights.dtype, device=weights.device)
    below = (cdf.unsqueeze(1) <= u).to(torch.int64)
    return torch.clamp(below.sum(dim=-1), max=weights.shape[-1] - 1)


def _without_replacement(weights: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Sequential draws without replacement, all at once: the categories with the
    num_samples largest log(w) + Gumbel noise, in decreasing order. A zero weight's
    key is -inf, below every positive weight's; as in eager, those come last, only
    once the positive weights are used up."""
    v = 1 - torch.rand(weights.shape, dtype=weights.dtype, device=weights.device)  # (0, 1]: log(v) finite
    gumbel = -torch.log(-torch.log(v))  # v = 1 gives +inf: first, and only for a positive weight below
    keys = torch.where(weights > 0, torch.log(weights) + gumbel, -math.inf)
    return torch.topk(keys, num_samples, dim=-1).indices
