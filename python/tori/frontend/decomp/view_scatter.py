"""The scatters of views (diagonal_scatter, as_strided_scatter): IREE's torch
lowering leaves them whole, and PyTorch's decompositions copy into a view (not
functional) or stop at prims.as_strided_scatter. Written as a select between the
input and the source gathered to the input's shape, or a scatter into the flat input."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.diagonal_scatter.default)
def diagonal_scatter(op, x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    moved = x.movedim((dim1, dim2), (-2, -1))
    rows, cols = moved.shape[-2:]
    length = src.shape[-1]
    if length == 0:
        return x.clone()
    row = torch.arange(rows, device=x.device).unsqueeze(-1)
    col = torch.arange(cols, device=x.device)
    on_diagonal = (col - row) == offset
    # Element (i, j) of the diagonal is src[..., i] above the main diagonal, src[..., j] below.
    if offset >= 0:
        values = src.index_select(-1, torch.arange(rows, device=x.device).clamp(max=length - 1)).unsqueeze(-1)
    else:
        values = src.index_select(-1, torch.arange(cols, device=x.device).clamp(max=length - 1)).unsqueeze(-2)
    return torch.where(on_diagonal, values.to(x.dtype), moved).movedim((-2, -1), (dim1, dim2))


@register_decomposition(aten.as_strided_scatter.default)
def as_strided_scatter(op, x, src, size, stride, storage_offset=None):
    if not x.is_contiguous() or any(isinstance(s, torch.SymInt) for s in (*size, *stride, storage_offset or 0)):
        return NotImplemented  # the positions below address a contiguous input
    # Offsets and strides address the storage of a fresh contiguous copy of x.
    positions = torch.full((), storage_offset or 0, dtype=torch.int64, device=x.device)
    for dim, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = extent
        positions = positions + (torch.arange(extent, device=x.device) * step).view(shape)
    flat = x.reshape(-1)
    return flat.index_put((positions.reshape(-1),), src.reshape(-1).to(x.dtype)).view(x.shape)
