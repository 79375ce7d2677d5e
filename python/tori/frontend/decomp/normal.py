"""normal with tensor mean and/or std, which IREE's torch lowering leaves whole:
mean + std * a standard normal sample of the broadcast shape. Eager rejects a
negative std; a compiled graph cannot raise, so there it samples with that std."""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def normal_of_tensors(op, mean, std=1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    dtype = torch.result_type(mean, std)
    if not dtype.is_floating_point:
        return NotImplemented
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    return mean + std * torch.randn(shape, dtype=dtype, device=tensors[0].device)
