"""log10, which IREE's llvm-cpu codegen lowers to a call of libm's log10f that the
module cannot link ("undefined symbol: log10f"): the natural log over ln(10), within
a few ulp of eager's log10 (float16 and bfloat16 computed in float32)."""

from __future__ import annotations

import math

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.log10.default)
def log10(op, x):
    if x.dtype.is_complex:
        return NotImplemented
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    wide = x.to(torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype)
    return (torch.log(wide) * (1.0 / math.log(10.0))).to(out_dtype)
