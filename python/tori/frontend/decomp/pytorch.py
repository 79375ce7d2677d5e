"""Ops that Torch-MLIR's table leaves whole and IREE cannot lower, where PyTorch's
own decomposition table has an entry that lowers correctly (checked per op by the
OpInfo conformance suite)."""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table as aten_decompositions

from tori.frontend.decomp.checks import unchecked
from tori.frontend.decompositions import as_is, register_decomposition

aten = torch.ops.aten

FROM_PYTORCH: tuple[torch._ops.OpOverload, ...] = (
    aten.addmv.default,
    aten.cumprod.default,
    aten.narrow_copy.default,
    aten._batch_norm_with_update_functional.default,
    # Ops IREE's torch lowering leaves whole (its error names a leftover constant).
    aten.as_strided_copy.default,
    aten.view_copy.default,
    aten.view_copy.dtype,
    aten.permute_copy.default,
    aten.unbind_copy.int,
    aten.new_empty_strided.default,
    aten.slice_scatter.default,
)

for _op in FROM_PYTORCH:
    register_decomposition(_op)(lambda op, *args, **kwargs: aten_decompositions[op](*args, **kwargs))


@register_decomposition(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool_with_indices(op, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    # The values come from the op itself, which IREE lowers to one pooling dispatch, over
    # the input padded explicitly (with the dtype's lowest value) or cropped so that the
    # windows tile it exactly; unused indices (max_pool2d without return_indices) are
    # traced away. Torch-MLIR's lowering of the op's indices fails to verify where the
    # windows do not tile the input (ceil_mode, ragged last windows, ResNet's stem pool):
    # PyTorch's decomposition computes them.
    decomposed = aten_decompositions[op]
    spatial = 3 if op is aten.max_pool3d_with_indices.default else 2
    if x.dim() == spatial + 1:  # unbatched (max_pool1d of (C, L) lands here): IREE's lowering wants a batch
        values, indices = _max_pool_with_indices(op, x.unsqueeze(0), kernel_size, stride, padding, dilation,
                                                 ceil_mode)
        return values.squeeze(0), indices.squeeze(0)
    sizes = x.shape[-spatial:]

    def each(value, default):
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        value = value or [default]
        return value * spatial if len(value) == 1 else value

    kernel = each(kernel_size, 1)
    steps = [k if s is None else s for k, s in zip(kernel, each(stride, None))]  # no stride: the kernel's
    pads, dilations = each(padding, 0), each(dilation, 1)
    if any(isinstance(n, int) and n == 0 for n in x.shape):
        # No element (an empty batch): empty values and indices of the output's shape.
        # PyTorch's decomposition reshapes the empty input with a -1 and raises.
        out = [(window_extent(n, k, s, p, d, ceil_mode) - d * (k - 1) - 1) // s + 1
               for n, k, s, p, d in zip(sizes, kernel, steps, pads, dilations)]
        shape = [*x.shape[:-spatial], *out]
        return x.new_empty(shape), torch.empty(shape, dtype=torch.int64, device=x.device)
    with unchecked():  # the decomposition's window indices are in range by construction
        indices = decomposed(x, kernel_size, stride, padding, dilation, ceil_mode)
        if not all(isinstance(n, int) for n in sizes) or x.numel() == 0:
            return indices
        extents = [window_extent(n, k, s, p, d, ceil_mode) for n, k, s, p, d in zip(sizes, kernel, steps, pads, dilations)]
        if all(e == n + 2 * p for e, n, p in zip(extents, sizes, pads)):
            return as_is(op, x, kernel_size, stride, padding, dilation, ceil_mode)[0], indices[1]
        if any(d != 1 for d in dilations):  # IREE's lowering of a dilated pool over a cropped input fails
            return indices
        framed = x
        for dim, (e, n, p) in enumerate(zip(extents, sizes, pads), start=x.dim() - spatial):
            if e < n + p:  # the last elements are in no window
                framed = aten.slice.Tensor(framed, dim, 0, e - p)
        # constant_pad_nd takes (left, right) pairs from the last dim backwards.
        widths = [w for e, n, p in reversed(list(zip(extents, sizes, pads))) for w in (p, max(e - n - p, 0))]
        lowest = -torch.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        framed = aten.constant_pad_nd.default(framed, widths, lowest)
        return as_is(op, framed, kernel, steps, [0] * spatial, dilations, False)[0], indices[1]


@register_decomposition(aten.avg_pool2d.default)
def _unbatched_or_ragged_avg_pool2d(op, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                                    count_include_pad=True, divisor_override=None):
    """avg_pool2d of an unbatched (C, H, W) input (avg_pool1d of (C, L) lands here) with a
    batch of one: IREE's linalg.pooling_nchw_sum failed to verify on the 3-D form. And
    windows that do not tile a dim exactly (length 3, kernel 2: the last element left
    out; or ceil_mode), which IREE's lowering fails on as avg_pool3d's: avg_pool3d's
    form over a depth of one (avg_pool.py)."""
    args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    if x.dim() == 3:
        return aten.avg_pool2d.default(x.unsqueeze(0), *args).squeeze(0)
    pair = lambda v: [v] * 2 if isinstance(v, int) else list(v) * (2 if len(v) == 1 else 1)  # noqa: E731
    kernel, pads = pair(kernel_size), pair(padding)
    steps = pair(stride) if stride else kernel
    sizes = x.shape[-2:]
    if any(isinstance(n, torch.SymInt) for n in sizes):
        return NotImplemented
    ragged = ceil_mode or any((n + 2 * p - k) % s for n, k, s, p in zip(sizes, kernel, steps, pads))
    if not ragged:
        return NotImplemented
    from tori.frontend.decomp.avg_pool import avg_pool3d

    pooled = avg_pool3d(aten.avg_pool3d.default, x.unsqueeze(-3), [1, *kernel], [1, *steps], [0, *pads], ceil_mode,
                        count_include_pad, divisor_override)
    return NotImplemented if pooled is NotImplemented else pooled.squeeze(-3)


def window_extent(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """The length of padded input that strided windows cover (pooling, and convolution
    without ceil_mode), as ATen counts the output size (pooling_output_shape): with
    ceil_mode a last window must start inside the input or its left padding."""
    span = dilation * (kernel - 1) + 1
    reach = size + 2 * pad - span
    out = (-(-reach // stride) if ceil_mode else reach // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return (out - 1) * stride + span
