"""Decompositions applied while AOTAutograd traces (the `aten` stage).

The base is Torch-MLIR's table for its importer; tori's own entries, one function
and one decorator each, cover ops that Torch-MLIR imports but IREE lowers wrongly
(precision) or not at all.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch._decomp import decomposition_table as aten_decompositions

aten = torch.ops.aten

_TORI: dict[torch._ops.OpOverload, Callable] = {}


def register_decomposition(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        for op in ops:
            if op in _TORI:
                raise ValueError(f"tori decomposition for {op} is registered twice")
            _TORI[op] = fn
        return fn

    return decorate


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    base = get_decomposition_table()
    return {**base, **{op: _chained(op, fn, base.get(op)) for op, fn in _TORI.items()}}


def _chained(op, fn: Callable, fallback: Callable | None) -> Callable:
    # A tori decomposition returns NotImplemented where it does not apply; then the
    # base table's entry (if any) decides, as it would without tori.
    def decompose(*args, **kwargs):
        result = fn(op, *args, **kwargs)
        if result is NotImplemented and fallback is not None:
            return fallback(*args, **kwargs)
        return result

    return decompose


# IREE's own gelu(approximate='tanh') is off by up to 5e-5 in float32.
register_decomposition(aten.gelu.default)(lambda op, *a, **k: aten_decompositions[op](*a, **k))

# IREE lowers the named shift ops but not the Python operators `<<`, `>>` on tensors.
register_decomposition(aten.__lshift__.Tensor)(lambda op, *a, **k: aten.bitwise_left_shift.Tensor(*a, **k))
register_decomposition(aten.__rshift__.Tensor)(lambda op, *a, **k: aten.bitwise_right_shift.Tensor(*a, **k))

_HALF = (torch.float16, torch.bfloat16)


@register_decomposition(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.cumsum.default)
def accumulate_half_in_float32(op, x, *args, dtype=None, **kwargs):
    """IREE accumulates float16/bfloat16 reductions in that type (a 4096-element
    float16 sum was off by 23.5); eager accumulates in float32, and so does tori."""
    if dtype is not None or x.dtype not in _HALF:
        return NotImplemented
    return op(x.to(torch.float32), *args, **kwargs).to(x.dtype)
