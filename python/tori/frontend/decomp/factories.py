"""Tensor factories IREE's torch lowering refuses: empty_strided with strides other
than the contiguous ones (new_empty_strided lands there). Its contents are undefined,
and the compiled graph's tensors are dense, so it is an empty tensor of the size.

An empty_strided with a zero extent is one too, its strides contiguous or not:
PyTorch's contiguous strides count a zero extent as one (a (s, 0) tensor has strides
(1, 1)), Torch-MLIR's default strides do not (0, 1), and where the other extents are
symbolic its lowering compiles the comparison into a check that fails on every call
("not all strides are default"; `torch.block_diag` of dynamic shapes)."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.empty_strided.default)
def empty_strided(op, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    if list(stride) == _contiguous_strides(size) and 0 not in [e for e in size if isinstance(e, int)]:
        return NotImplemented  # lowered as it is
    return torch.empty(size, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)


def _contiguous_strides(size) -> list:
    strides, step = [], 1
    for extent in reversed(list(size)):
        strides.append(step)
        step *= max(extent, 1)
    return strides[::-1]
