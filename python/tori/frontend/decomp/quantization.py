"""Dynamic activation quantization (PT2E with `is_dynamic=True`): the scale and zero
point of each activation are computed per call (`quantized_decomposed.choose_qparams
.tensor`) and passed as tensors to `quantize_per_tensor.tensor` and
`dequantize_per_tensor.tensor`. Torch-MLIR imports none of the three (IREE failed on
`choose_qparams`); their PyTorch kernels read the tensors with `.item()`, which a
traced graph cannot. Here they are formulas in torch ops with eager's arithmetic:
min/max in the input's dtype, the scale widened to float64 as eager returns it, the
inverse scale rounded to the input's dtype. The matmul between them then runs in
float32 on the dequantized values (the integer form needs a constant scale:
frontend/quantized.py).

Not covered: an input with no finite values (eager returns scale 1, zero point 0).
"""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the quantized_decomposed ops)

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


@register_decomposition(qd.choose_qparams.tensor)
def choose_qparams(op, x, quant_min, quant_max, eps, dtype):
    low, high = aten.aminmax.default(x)
    low = torch.minimum(low, torch.zeros_like(low))
    high = torch.maximum(high, torch.zeros_like(high))
    scale = (high - low) / float(quant_max - quant_min)
    scale = torch.maximum(scale, torch.full_like(scale, eps))
    zero_point = quant_min - torch.round(low / scale).to(torch.int32)
    zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(1).to(torch.float64), zero_point.reshape(1).to(torch.int64)


@register_decomposition(qd.quantize_per_tensor.tensor)
def quantize_per_tensor(op, x, scale, zero_point, quant_min, quant_max, dtype):
    inverse = (1.0 / scale).to(x.dtype)
    shifted = torch.round(x * inverse) + zero_point.to(x.dtype)
    return torch.clamp(shifted, quant_min, quant_max).to(dtype)


@register_decomposition(qd.dequantize_per_tensor.tensor)
def dequantize_per_tensor(op, q, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    out_dtype = out_dtype or torch.float32
    return (q.to(out_dtype) - zero_point.to(out_dtype)) * scale.to(out_dtype)
