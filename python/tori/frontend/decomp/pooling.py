"""Max pooling that IREE does not lower, over windows gathered to one fixed length:
adaptive max pooling with window sizes that do not divide the input, and fractional
max pooling (windows placed by random samples). Then the maximum and the index that
eager's CPU kernel picks."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _windows(size: int, out: int, device) -> torch.Tensor:
    """Input positions of each adaptive window (start = ⌊i·size/out⌋, end =
    ⌈(i+1)·size/out⌉), padded to the longest by repeating the window's last position:
    (out, longest). Built with arange: index lists from torch.tensor would put a
    non-functional detach_ into the graph."""
    longest = max(-(-((i + 1) * size) // out) - (i * size) // out for i in range(out))
    i = torch.arange(out, device=device).unsqueeze(1)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    return torch.minimum(start + torch.arange(longest, device=device), end - 1)


@register_decomposition(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(op, x, output_size):
    """Values and flat (h·W + w) indices. As in eager's kernel, a NaN wins (the last
    one in the window's row-major order), else the first occurrence of the maximum."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented
    (height, width), (out_h, out_w) = x.shape[-2:], output_size
    if not all(isinstance(n, int) for n in (height, width, out_h, out_w)):
        return NotImplemented
    if out_h == 0 or out_w == 0 or height == 0 or width == 0:
        return NotImplemented
    rows, cols = _windows(height, out_h, x.device), _windows(width, out_w, x.device)
    k_h, k_w = rows.shape[1], cols.shape[1]
    gathered = x.index_select(-2, rows.flatten()).index_select(-1, cols.flatten())
    batch = x.shape[:-2]
    window = gathered.reshape(*batch, out_h, k_h, out_w, k_w).transpose(-3, -2).reshape(*batch, out_h, out_w, k_h * k_w)
    flat = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(out_h, out_w, k_h * k_w)

    choice, values = _window_max(window)
    indices = flat.expand(*batch, out_h, out_w, k_h * k_w).gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    return values, indices


def _window_max(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The position in each window (last dim) that eager's kernels choose, and its
    value: a NaN wins (the last one in the window's row-major order), else the first
    occurrence of the maximum."""
    length = window.shape[-1]
    nan = torch.isnan(window)
    has_nan = nan.any(-1)
    filled = window.masked_fill(nan, -math.inf)
    largest = filled.amax(-1)
    position = torch.arange(length, device=window.device)
    first_largest = torch.where(filled == largest.unsqueeze(-1), position, length).amin(-1)
    last_nan = torch.where(nan, position, -1).amax(-1)
    choice = torch.where(has_nan, last_nan, first_largest)
    return choice, torch.where(has_nan, torch.full_like(largest, math.nan), largest)


def _fractional_starts(sample: torch.Tensor, size: int, out: int, kernel: int) -> torch.Tensor:
    """Where each of the `out` windows starts, for each plane's sample in [0, 1):
    ⌊(i + u)·α⌋ - ⌊u·α⌋ with α = (size - kernel) / (out - 1), the last window at
    size - kernel. Computed in the sample's dtype, one rounding per step, as ATen's
    kernel does (its arithmetic is in the input's scalar type, float16 included);
    clamped into the input, where ATen would read past it."""
    last = torch.full((*sample.shape, 1), size - kernel, dtype=torch.int64, device=sample.device)
    if out == 1:
        return last
    alpha = torch.full((), size - kernel, dtype=sample.dtype, device=sample.device) / (out - 1)
    steps = torch.arange(out - 1, device=sample.device).to(sample.dtype)
    sample = sample.unsqueeze(-1)
    starts = ((steps + sample) * alpha).to(torch.int64) - (sample * alpha).to(torch.int64)
    return torch.cat([starts.clamp(0, size - kernel), last], -1)


def _fractional_max_pool(x, kernel_size, output_size, samples, sample_index):
    """Values and indices (flat over the input's spatial dims) of fractional max
    pooling over the last len(kernel_size) dims; `sample_index[d]`: the entry of each
    plane's samples that places the windows along spatial dim d."""
    spatial = len(kernel_size)
    if not x.dtype.is_floating_point or x.dim() not in (spatial + 1, spatial + 2):
        return NotImplemented
    sizes = tuple(x.shape[-spatial:])
    if not all(isinstance(n, int) for n in (*x.shape, *kernel_size, *output_size)) or x.numel() == 0:
        return NotImplemented
    if any(o == 0 or k > n for o, k, n in zip(output_size, kernel_size, sizes)):
        return NotImplemented
    batched = x if x.dim() == spatial + 2 else x.unsqueeze(0)
    planes = batched.shape[:2]
    flat = torch.zeros((), dtype=torch.int64, device=x.device)
    stride = 1
    for dim in reversed(range(spatial)):
        starts = _fractional_starts(samples[..., sample_index[dim]], sizes[dim], output_size[dim], kernel_size[dim])
        positions = starts.unsqueeze(-1) + torch.arange(kernel_size[dim], device=x.device)
        shape = [*planes, *(output_size[d] if d == dim else 1 for d in range(spatial)),
                 *(kernel_size[d] if d == dim else 1 for d in range(spatial))]
        flat = flat + positions.reshape(shape) * stride
        stride *= sizes[dim]
    windows, length = math.prod(output_size), math.prod(kernel_size)
    flat = flat.reshape(*planes, windows * length)
    window = batched.reshape(*planes, -1).gather(-1, flat).reshape(*planes, windows, length)
    choice, values = _window_max(window)
    indices = flat.reshape(*planes, windows, length).gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    values, indices = values.reshape(*planes, *output_size), indices.reshape(*planes, *output_size)
    if x.dim() == spatial + 1:
        values, indices = values.squeeze(0), indices.squeeze(0)
    return values, indices


@register_decomposition(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(op, x, kernel_size, output_size, random_samples):
    """ATen's kernel takes each plane's first sample for the width, the second for the height."""
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, sample_index=(1, 0))


@register_decomposition(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(op, x, kernel_size, output_size, random_samples):
    """Samples in the order time, height, width."""
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, sample_index=(0, 1, 2))
