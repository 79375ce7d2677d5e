"""grid_sampler_3d (trilinear and nearest), which IREE does not lower: ATen's CPU
kernel as torch ops, after PyTorch's grid_sampler_2d decomposition: source coordinates
per axis, the corner values gathered by advanced indexing and weighted."""

from __future__ import annotations

import itertools

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _source_index(coords: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """ATen's grid_sampler_compute_source_index, with its order of operations (float16
    rounds after each one, in eager as in IREE)."""
    if align_corners:  # [-1, 1] to [0, size - 1]
        coords = ((coords + 1) / 2) * (size - 1)
    else:  # [-1, 1] to [-0.5, size - 0.5]
        coords = ((coords + 1) * size - 1) / 2
    if padding_mode == 0:  # zeros
        return coords
    if padding_mode == 2:  # reflection
        twice_low, twice_high = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if twice_low == twice_high:
            coords = torch.zeros_like(coords)
        else:
            low, span = twice_low / 2, (twice_high - twice_low) / 2
            distance = torch.abs(coords - low)
            extra = torch.fmod(distance, torch.full_like(distance, span))  # IREE lowers no fmod by a scalar
            flips = torch.floor(distance / span)
            coords = torch.where(torch.remainder(flips, 2) == 0, extra + low, span - extra + low)
    return torch.clamp(coords, 0, size - 1)


@register_decomposition(aten.grid_sampler_3d.default)
def grid_sampler_3d(op, a, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Corners summed in eager's order (x fastest, then y, then z), as ATen's CPU
    kernel. float32 only: in float16, eager rounds after every operation and IREE's
    result differed from it by up to 0.0085 in 2 of 7920 elements."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1, 2) or a.dim() != 5 or grid.shape[-1] != 3:
        return NotImplemented
    if a.dtype != torch.float32 or grid.dtype != a.dtype:
        return NotImplemented
    n, c, depth, height, width = a.shape
    sizes = (width, height, depth)
    coords = [_source_index(grid[..., axis], sizes[axis], padding_mode, align_corners) for axis in range(3)]
    n_index = torch.arange(n, device=a.device).view(n, 1, 1, 1, 1)
    c_index = torch.arange(c, device=a.device).view(1, c, 1, 1, 1)

    def corner(points, weight):
        inside = None
        for point, size in zip(points, sizes):
            ok = (point >= 0) & (point < size)
            inside = ok if inside is None else inside & ok
        x, y, z = (torch.where(inside, point, 0).to(torch.int64).unsqueeze(1) for point in points)
        # An outside corner adds nothing (not 0 times a value that may be inf or NaN).
        return torch.where(inside.unsqueeze(1), a[n_index, c_index, z, y, x] * weight.unsqueeze(1), 0)

    if interpolation_mode == 1:  # nearest (half to even, as eager's nearbyint)
        return corner([torch.round(t) for t in coords], torch.ones_like(coords[0]))
    low = [torch.floor(t) for t in coords]
    result = None
    for oz, oy, ox in itertools.product((0, 1), repeat=3):
        weight = None
        for t, lo, o in zip(coords, low, (ox, oy, oz)):
            factor = (t - lo) if o else ((lo + 1) - t)
            weight = factor if weight is None else weight * factor
        term = corner([lo + o for lo, o in zip(low, (ox, oy, oz))], weight)
        result = term if result is None else result + term
    return result
