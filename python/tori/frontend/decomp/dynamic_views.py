"""Views of tensors with dynamic sizes, through their flat form.

Torch-MLIR lowers `view` of a tensor with several dynamic dims by pairing the old
dims with the new ones; where the new shape does not split or merge the old dims in
order (`x.reshape(1, -1)` of an `[s0, s1]` tensor: the 1 taken as dim 0), the module
it builds asserts a size that is not there, and every call fails ("tensor shape
dimension 0 mismatch; expected 1 but have 4"). Flattening first and viewing the flat
tensor as the new shape is the same view, and both steps lower for any sizes.
Static shapes, and new shapes of other forms, are left as they are.
"""

from __future__ import annotations

import torch
from torch._prims_common import infer_size

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _dynamic(sizes) -> bool:
    return any(not isinstance(size, int) for size in sizes)


@register_decomposition(aten.view.default, aten._unsafe_view.default)
def view_through_flat(op, x, size):
    # The failing form: a static leading size and a -1 (reshape(1, -1), (2, -1)). Others
    # lower as they are, and some (reshape(-1, 1, 2)) only so.
    leading_static = isinstance(size[0], int) and size[0] >= 0 if size else False
    if x.dim() < 2 or len(size) < 2 or not _dynamic(x.shape) or not leading_static or -1 not in size:
        return NotImplemented
    # A view of a transposed tensor that keeps its dims apart has no flat form: its
    # values in order first (contiguous() of a contiguous tensor is the tensor itself).
    # The -1 resolved here: Torch-MLIR's own resolution of it in a view of a dynamic
    # 1-D tensor gave a negative size. A -1 that no size resolves (no element) is left
    # to the op's own handling.
    try:
        sizes = list(infer_size(size, x.numel()))
    except RuntimeError:
        return NotImplemented
    return op(op(x.contiguous(), [-1]), sizes)
