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
    # Where the windows tile the padded input exactly, the values come from the op itself,
    # which IREE lowers to one pooling dispatch, and unused indices (max_pool2d without
    # return_indices) are traced away. Elsewhere Torch-MLIR's lowering of the op's indices
    # fails to verify (ceil_mode, ragged last windows): PyTorch's decomposition computes both.
    decomposed = aten_decompositions[op]
    spatial = 3 if op is aten.max_pool3d_with_indices.default else 2
    sizes = x.shape[-spatial:]

    def each(value, default):
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        value = value or [default]
        return value * spatial if len(value) == 1 else value

    kernel = each(kernel_size, 1)
    steps = [k if s is None else s for k, s in zip(kernel, each(stride, None))]  # no stride: the kernel's
    pads, dilations = each(padding, 0), each(dilation, 1)
    exact = not ceil_mode and all(
        isinstance(n, int) and (n + 2 * p - d * (k - 1) - 1) % s == 0
        for n, k, s, p, d in zip(sizes, kernel, steps, pads, dilations))
    with unchecked():  # the decomposition's window indices are in range by construction
        if not exact:
            return decomposed(x, kernel_size, stride, padding, dilation, ceil_mode)
        values = as_is(op, x, kernel_size, stride, padding, dilation, ceil_mode)[0]
        return values, decomposed(x, kernel_size, stride, padding, dilation, ceil_mode)[1]
