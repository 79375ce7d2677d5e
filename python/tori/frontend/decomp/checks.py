"""Checks in front of ops for which eager raises on bad values and IREE's code does
not: an index out of range (IREE's gathers and scatters read and write past the
tensor: garbage, or a segfault) and integer division by zero (IREE returned garbage).

Every op below is traced after an `aten._assert_async` of its operands' values,
which tori imports as a `torch.runtime.assert` (frontend/higher_order.py): IREE's
runtime evaluates it on every call, before the op runs. A failing call raises, with
any fallback (eager would fail too), `tori.errors.IndexOutOfRangeError` (an
IndexError) where eager raises IndexError, `IndexOutOfBoundsError` where eager raises
a RuntimeError about an index, and `CheckFailedError` with eager's message
"ZeroDivisionError". A check is one fused reduction over the operand. Where eager
counts negative indices from the end, they are made positive before the op: IREE's
index_put wrote them before the tensor.

`wrap` puts the checks in front of the decomposition table's entries (or of the op
itself), so tori's and PyTorch's decompositions of these ops still apply after them.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator, NamedTuple

import torch

from tori.errors import INDEX_ERROR_CHECK, INDEX_RUNTIME_CHECK, ZERO_DIVISION_CHECK

aten = torch.ops.aten

_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# Ops indexing `x` (args[0]) with a list of index tensors (args[1]), one per dim in
# order; a negative index counts from the end, and eager raises IndexError.
_LISTED = frozenset({aten.index.Tensor, aten.index_put.default})


class Along(NamedTuple):
    """An op indexing one dim of args[0] with the index tensor at args[position]."""

    position: int
    negative: bool  # whether -size <= index < 0 counts from the end
    index_error: bool  # whether eager raises IndexError (else RuntimeError)
    dim: int | None = None  # the dim, where the op has no dim argument (args[1])


_ALONG: dict[torch._ops.OpOverload, Along] = {
    aten.index_select.default: Along(2, False, True),
    aten.index_copy.default: Along(2, False, True),
    aten.index_fill.int_Scalar: Along(2, True, True),
    aten.index_fill.int_Tensor: Along(2, True, True),
    aten.embedding.default: Along(1, False, True, dim=0),
    aten.index_add.default: Along(2, False, False),
    aten.gather.default: Along(2, False, False),
    **{op: Along(2, False, False) for op in (aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
                                             aten.scatter.value_reduce, aten.scatter_add.default,
                                             aten.scatter_reduce.two)},
}

# Set while a checked op is traced after its check: the op's own call inside the
# wrapper (and what its decomposition calls) is not checked again.
_CHECKED = contextvars.ContextVar("tori_bounds_checked", default=False)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Trace without bounds checks: for indices a decomposition builds in range itself
    (a check would also keep them alive when their result goes unused)."""
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def _checked_index(op, index, dim: int, size, negative: bool, index_error: bool):
    """`index` after an assert that it lies in range for a dim of `size`; negative
    indices made positive, as IREE's index_put would write before the tensor."""
    if not isinstance(index, torch.Tensor) or index.dtype not in _INTEGER or index.numel() == 0:
        return index
    low = -size if negative else 0
    flat = index.reshape(-1)  # min and max: IREE's `all` of an expanded index with a dynamic size failed
    ok = (flat.amin() >= low) & (flat.amax() < size)
    kind = INDEX_ERROR_CHECK if index_error else INDEX_RUNTIME_CHECK
    name = op.name().removeprefix("aten::").split(".")[0]
    aten._assert_async.msg(ok, f"{kind} in {name}: an index for dimension {dim} (size {size}) "
                               f"is outside {low} <= index < {size}")
    return torch.where(index < 0, index + size, index) if negative else index


# Integer division and remainder: (dividend, divisor, ...) with a tensor or number divisor.
_DIVISIONS = frozenset({
    aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar,
    aten.remainder.Tensor, aten.remainder.Scalar, aten.fmod.Tensor, aten.fmod.Scalar,
})


def _checked_divisor(a, b) -> None:
    tensors = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    if not tensors or torch.result_type(a, b).is_floating_point or torch.result_type(a, b) == torch.bool:
        return
    if isinstance(b, torch.Tensor):
        if b.numel() == 0:
            return
        # max rather than all(): IREE's `all` of a broadcast with a dynamic size needed an
        # unbounded stack allocation
        ok = (b == 0).reshape(-1).to(torch.int32).amax() <= 0
    elif b != 0:
        return
    else:
        ok = torch.zeros((), dtype=torch.bool, device=tensors[0].device)
    aten._assert_async.msg(ok, f"{ZERO_DIVISION_CHECK}: an integer division or remainder by zero")


def _checked_args(op, args: list) -> list:
    x = args[0]
    if op in _DIVISIONS:
        if len(args) > 1:
            _checked_divisor(x, args[1])
        return args
    if op in _LISTED:
        indices, dim = list(args[1]), 0
        for k, index in enumerate(indices):
            if index is None:
                dim += 1
            elif index.dtype in (torch.bool, torch.uint8):  # a mask takes its own rank of dims
                dim += index.dim()
            else:
                indices[k] = _checked_index(op, index, dim, x.shape[dim], True, True)
                dim += 1
        return [x, indices, *args[2:]]
    along = _ALONG[op]
    if len(args) <= along.position:  # the index passed by keyword: left unchecked
        return args
    dim = along.dim if along.dim is not None else args[1] % max(x.dim(), 1)
    size = x.shape[dim] if x.dim() else 1
    args[along.position] = _checked_index(op, args[along.position], dim, size, along.negative, along.index_error)
    return args


def _checked(op, inner: Callable | None) -> Callable:
    def decompose(*args, **kwargs):
        if _CHECKED.get():
            return NotImplemented if inner is None else inner(*args, **kwargs)
        args = _checked_args(op, list(args))
        token = _CHECKED.set(True)
        try:
            result = NotImplemented if inner is None else inner(*args, **kwargs)
            return op(*args, **kwargs) if result is NotImplemented else result
        finally:
            _CHECKED.reset(token)

    return decompose


def wrap(table: dict) -> dict:
    """`table` with every indexing op's entry behind its bounds check."""
    checked = dict(table)
    for op in (*_LISTED, *_ALONG, *_DIVISIONS):
        checked[op] = _checked(op, table.get(op))
    return checked
