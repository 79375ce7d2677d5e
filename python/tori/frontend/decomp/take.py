"""take with a 0-d index: Torch-MLIR's decomposition indexes the flat input with the
index tensor, which PyTorch reads as a Python integer (a data-dependent `.item()`
that AOTAutograd refuses). Here an index_select of the one index, wrapped when
negative as eager's take does."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.take.default)
def take_one(op, x, index):
    if index.dim() != 0:
        return NotImplemented
    flat = x.reshape(-1)
    position = index.reshape(1)
    position = torch.where(position < 0, position + flat.shape[0], position)
    return flat.index_select(0, position).reshape(())

