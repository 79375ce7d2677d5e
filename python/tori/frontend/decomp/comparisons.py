"""Comparisons of a tensor with a Python number, in the dtype eager compares them in
(`torch.result_type`): the number is cast to it, and so is the tensor where its own
dtype differs.

- A float tensor: Torch-MLIR's lowering compares in the number's own precision,
  float64, once IREE no longer demotes float64 (tori keeps float64 models exact):
  float32(0.1) == 0.1 was false and float32(0.1) > 0.1 true, where eager gives true and
  false. The widened operands could also make a data-tiled dispatch fail to compile:
  MobileNetV3's hardswish clamps (`lt` and `gt` against 0.0 and 6.0) fused into one
  were float64 vectors of 32 KB, past IREE's limit, in the module tori writes with
  `dump_dir` set (it compiled again on IREE's other data-tiling path). The number
  becomes a 0-d tensor of the comparison's dtype.
- A bool tensor and a number that is not a bool: eager compares in the number's type
  (False > -1 is true); IREE's lowering truncated the number to i1.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_AS_TENSORS = {
    aten.lt.Scalar: aten.lt.Tensor, aten.le.Scalar: aten.le.Tensor, aten.gt.Scalar: aten.gt.Tensor,
    aten.ge.Scalar: aten.ge.Tensor, aten.eq.Scalar: aten.eq.Tensor, aten.ne.Scalar: aten.ne.Tensor,
}


@register_decomposition(*_AS_TENSORS)
def compare_with_number(op, x, number):
    if isinstance(number, bool):
        return NotImplemented
    dtype = torch.result_type(x, number)
    if dtype.is_floating_point and dtype != torch.float64:
        return _AS_TENSORS[op](x.to(dtype), aten.scalar_tensor.default(number, dtype=dtype, device=x.device))
    if x.dtype != dtype:
        return op(x.to(dtype), number)
    return NotImplemented
