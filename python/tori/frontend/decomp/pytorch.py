"""Ops that Torch-MLIR's table leaves whole and IREE cannot lower, where PyTorch's
own decomposition table has an entry that lowers correctly (checked per op by the
OpInfo conformance suite)."""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table as aten_decompositions

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

FROM_PYTORCH: tuple[torch._ops.OpOverload, ...] = (
    aten.addmv.default,
    aten.cumprod.default,
    aten.narrow_copy.default,
    aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices.default,
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
