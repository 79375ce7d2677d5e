"""float16 and bfloat16 ops computed in float32, rounded once per op, as eager does.

PyTorch's CPU kernels compute each op on 16-bit floats in float32 ("opmath") and
round the result; IREE computes in the 16-bit type itself, so an op of several
steps rounds several times (asinh and exp2 were 1-3 ulp off, a float16 vector norm
overflowed to inf where eager's is finite, matrix products accumulated in float16).
Ops that Dynamo itself splits (addcdiv into div, mul and add) round after each
part, as explicit conversions in the program do: those are kept. Every op
below, given 16-bit float tensors of one dtype, is traced as: inputs converted to
float32, the op, its float32 results converted back. IREE fuses the conversions
into the op's dispatch. Ops that are exact in any precision (copies, comparisons,
min/max, rounding) are left alone.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.utils._pytree as pytree

aten = torch.ops.aten

HALF = (torch.float16, torch.bfloat16)

# Exact in the 16-bit type: computing them in float32 would only add conversions.
_EXACT = frozenset({
    "abs", "neg", "positive", "sign", "sgn", "signbit", "ceil", "floor", "round", "trunc", "frac", "clamp",
    "clamp_min", "clamp_max", "clip", "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge",
    "isnan", "isinf", "isfinite", "isneginf", "isposinf", "isreal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "where", "masked_fill", "clone", "copy", "fill", "nan_to_num", "conj_physical", "real", "imag",
    "copysign", "relu", "hardtanh", "threshold", "_to_copy", "heaviside", "nextafter", "lift_fresh_copy",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "bitwise_not",
})

# Not tagged pointwise, but computed in float32 by eager's CPU kernels for 16-bit floats.
_ACCUMULATING = (
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten.addbmm.default,
    aten.addr.default, aten.mv.default, aten.addmv.default, aten.dot.default, aten.vdot.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.native_layer_norm.default, aten.native_layer_norm_backward.default, aten.native_group_norm.default,
    aten.native_group_norm_backward.default, aten._native_batch_norm_legit_no_training.default,
    aten.linalg_vector_norm.default, aten.var.correction, aten.var_mean.correction, aten.std.correction,
    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.prod.default,
    aten.prod.dim_int, aten.cumsum.default, aten.cumprod.default, aten.logsumexp.default,
    aten.logcumsumexp.default, aten.avg_pool2d.default, aten.avg_pool3d.default, aten.avg_pool2d_backward.default,
    aten._adaptive_avg_pool2d.default, aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec,
    aten.upsample_trilinear3d.vec, aten.upsample_linear1d.vec, aten.grid_sampler_2d.default,
    aten._cdist_forward.default, aten.mse_loss.default, aten.binary_cross_entropy.default,
)


def _pointwise_ops() -> list[torch._ops.OpOverload]:
    ops = []
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket) or name.endswith("_") or name in _EXACT:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.pointwise in op.tags and "out" not in overload:
                ops.append(op)
    return ops


def _half_dtype(args, kwargs) -> torch.dtype | None:
    """The 16-bit float dtype of every floating tensor argument, if they share one."""
    dtypes = {leaf.dtype for leaf in pytree.tree_leaves((args, kwargs))
              if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in HALF else None


def in_float32(op: torch._ops.OpOverload, inner: Callable | None) -> Callable:
    """The table entry for `op`: in float32 for 16-bit float arguments, else `inner`
    (the entry it replaces, or none: the op is traced as it is)."""

    def decompose(*args, **kwargs):
        half = _half_dtype(args, kwargs)
        if half is None or kwargs.get("dtype") is not None:
            return inner(*args, **kwargs) if inner is not None else NotImplemented
        up = pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float32) if t.dtype == half else t,
                                  (args, kwargs))
        result = op(*up[0], **up[1])  # traced again: in float32 the entry is `inner`
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(half) if t.dtype == torch.float32 else t, result)

    return decompose


def wrap(table: dict) -> dict:
    """`table` with every op above computed in float32 for 16-bit floats."""
    wrapped = dict(table)
    for op in [*_pointwise_ops(), *_ACCUMULATING]:
        wrapped[op] = in_float32(op, table.get(op))
    return wrapped

