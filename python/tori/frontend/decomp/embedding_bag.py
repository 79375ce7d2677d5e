"""embedding_bag in 'sum' mode with per_sample_weights: IREE's lowering of
_embedding_bag ignores the weights (a silently wrong sum). Written as each index's
row times its weight, added into its bag (`index_add`); the other results have the
shapes and values of eager's CPU kernel in that mode (no offset2bag, zero sizes)."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten
_SUM = 0


@register_decomposition(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def weighted_embedding_bag(op, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                           per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    if mode != _SUM or per_sample_weights is None or indices.dim() != 1 or offsets.dim() != 1:
        return NotImplemented
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    starts = offsets[:bags]
    position = torch.arange(indices.shape[0], device=indices.device)
    bag = (position.unsqueeze(1) >= starts.unsqueeze(0)).sum(1) - 1
    keep = bag >= 0
    if include_last_offset:
        keep = keep & (position < offsets[-1])
    if padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    wide = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    rows = weight.index_select(0, indices).to(wide) * per_sample_weights.to(wide).unsqueeze(1)
    rows = torch.where(keep.unsqueeze(1), rows, torch.zeros_like(rows))
    out = torch.zeros(bags, weight.shape[1], dtype=wide, device=weight.device).index_add(0, bag.clamp(min=0), rows)
    sizes = bags if op is aten._embedding_bag.default else offsets.shape[0]
    no_bags = torch.zeros(sizes, dtype=offsets.dtype, device=offsets.device)
    return (out.to(weight.dtype), torch.zeros(0, dtype=offsets.dtype, device=offsets.device), no_bags,
            no_bags.clone())
