"""Sorting, selection and scans (sort, topk, kthvalue, median, mode, max/min over a
dim, cummax/cummin): integer keys that order as eager orders the values, sorted or
compared; IREE's own lowerings mishandle NaN, ties and repeated sorts.

What IREE gets wrong, measured on llvm-cpu:
- its sort and top-k compare floats with `olt`/`oge`, so a NaN stays where it was
  (eager orders NaN above everything);
- two sorts of one shape in one graph share the iota that seeds their indices, and
  one of them returns the other's permutation (a sort's values are right);
- max/min over a dim return the wrong index where the row holds a NaN.

So a float becomes an integer key (its IEEE bits, negatives reflected, -0.0 as 0.0,
NaN at one end), the key and the position are packed into one int64, and only the
values of that sort are used: packed keys are distinct, so the order is total and
stable and the indices come out of the low 32 bits.
"""

from __future__ import annotations

import threading

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
_NARROW = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32, torch.float16,
           torch.bfloat16)
_POSITION_BITS = 32
# Comparison matrices (n x n per row) are built only up to this many elements.
_MAX_PAIRS = 1 << 24

_IN_SORT = threading.local()


def _order_key(x: torch.Tensor, nan_high: bool = True) -> torch.Tensor:
    """An integer tensor ordered as `x` is by eager's sort: -0.0 equal to 0.0, every
    NaN equal to the others and above (`nan_high`) or below everything else."""
    if x.dtype not in _BITS:
        return x.to(torch.int64)
    bits_dtype = _BITS[x.dtype]
    info = torch.iinfo(bits_dtype)
    bits = x.view(bits_dtype)
    # A negative float's bits grow with its magnitude: reflect them below zero.
    key = torch.where(bits < 0, torch.bitwise_not(bits) + info.min, bits)
    key = torch.where(x == 0, torch.zeros_like(key), key)
    return torch.where(torch.isnan(x), torch.full_like(key, info.max if nan_high else info.min), key)


def _positions(x: torch.Tensor, dim: int) -> torch.Tensor:
    """0..n-1 along `dim`, shaped to broadcast against `x`."""
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    return torch.arange(x.shape[dim], dtype=torch.int64, device=x.device).view(shape)


def _sort_indices(x: torch.Tensor, dim: int, descending: bool):
    """The permutation that sorts `x` stably along `dim` (as eager's stable sort), or
    NotImplemented where no exact formulation applies."""
    key = _order_key(x).to(torch.int64)
    if descending:
        key = torch.bitwise_not(key)  # reverses the order, overflows nowhere
    if x.dtype in _NARROW:
        packed = key * (1 << _POSITION_BITS) + _positions(x, dim)
        _IN_SORT.active = True
        try:
            ordered = aten.sort.default(packed, dim)[0]
        finally:
            _IN_SORT.active = False
        return torch.bitwise_and(ordered, (1 << _POSITION_BITS) - 1)
    n = x.shape[dim]
    if x.numel() * n > _MAX_PAIRS:
        return NotImplemented
    # 64-bit keys: each element's rank is the number of elements before it.
    rows = key.movedim(dim, -1)
    mine, other = rows.unsqueeze(-1), rows.unsqueeze(-2)
    earlier = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)
    rank = ((other < mine) | ((other == mine) & earlier)).sum(-1)
    at_rank = rank.unsqueeze(-2) == torch.arange(n, device=x.device).unsqueeze(-1)
    order = (at_rank * torch.arange(n, device=x.device)).sum(-1)
    return order.movedim(-1, dim)


def _no_index(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=x.device)


def _sort(x: torch.Tensor, dim: int, descending: bool):
    if x.dim() == 0:
        return x.clone(), _no_index(x)
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        return x.clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    indices = _sort_indices(x, dim, descending)
    if indices is NotImplemented:
        return NotImplemented
    return torch.gather(x, dim, indices), indices


@register_decomposition(aten.sort.default)
def sort(op, x, dim=-1, descending=False):
    """A stable sort, NaN last (first when descending); eager's unstable sort is
    stable on short rows and any order of ties is one it may return."""
    if getattr(_IN_SORT, "active", False):
        return NotImplemented  # the packed keys' own sort
    return _sort(x, dim, descending)


@register_decomposition(aten.sort.stable)
def sort_stable(op, x, *, stable=None, dim=-1, descending=False):
    result = _sort(x, dim, descending)
    if result is NotImplemented:
        return aten.sort.default(x, dim, descending)  # IREE's sort is stable
    return result


@register_decomposition(aten.topk.default)
def topk(op, x, k, dim=-1, largest=True, sorted=True):
    """The first k of a stable sort; ties in eager's top-k come in no defined order."""
    if x.dim() == 0:
        return (x.clone(), _no_index(x)) if k == 1 else NotImplemented
    dim = dim % x.dim()
    if x.shape[dim] == 0 or not 0 <= k <= x.shape[dim]:
        return NotImplemented
    indices = _sort_indices(x, dim, descending=largest)
    if indices is NotImplemented:
        return NotImplemented
    indices = indices.narrow(dim, 0, k)
    return torch.gather(x, dim, indices), indices


def _pick(x: torch.Tensor, dim: int, indices: torch.Tensor, keepdim: bool):
    """The values of `x` at `indices` (size 1 along `dim`), and the indices."""
    values = torch.gather(x, dim, indices)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@register_decomposition(aten.kthvalue.default)
def kthvalue(op, x, k, dim=-1, keepdim=False):
    if x.dim() == 0:
        return (x.clone(), _no_index(x)) if k == 1 else NotImplemented
    dim = dim % x.dim()
    if not 1 <= k <= x.shape[dim]:
        return NotImplemented
    indices = _sort_indices(x, dim, descending=False)
    if indices is NotImplemented:
        return NotImplemented
    return _pick(x, dim, indices.narrow(dim, k - 1, 1), keepdim)


def _median(x: torch.Tensor, dim: int, keepdim: bool, ignore_nan: bool):
    """Eager's lower median: with a NaN in the row, median gives the row's first NaN;
    nanmedian gives the median of the other values (the first NaN if all are)."""
    if x.dim() == 0:
        return x.clone(), _no_index(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        return NotImplemented
    indices = _sort_indices(x, dim, descending=False)
    if indices is NotImplemented:
        return NotImplemented
    middle = torch.full_like(indices.narrow(dim, 0, 1), (n - 1) // 2)
    if x.dtype.is_floating_point:
        # Sorted, the row's NaNs are last, in their order.
        nans = torch.isnan(x).sum(dim, keepdim=True)
        if ignore_nan:
            rest = n - nans
            middle = torch.where(rest > 0, torch.div(rest - 1, 2, rounding_mode="floor"), torch.zeros_like(rest))
        else:
            middle = torch.where(nans > 0, n - nans, middle)
    return _pick(x, dim, torch.gather(indices, dim, middle), keepdim)


@register_decomposition(aten.median.dim, aten.nanmedian.dim)
def median_dim(op, x, dim=-1, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=op is aten.nanmedian.dim)


@register_decomposition(aten.median.default, aten.nanmedian.default)
def median(op, x):
    if x.numel() == 0:
        return NotImplemented
    result = _median(x.reshape(-1), 0, False, ignore_nan=op is aten.nanmedian.default)
    return result if result is NotImplemented else result[0]


@register_decomposition(aten.max.dim, aten.min.dim)
def max_min_dim(op, x, dim, keepdim=False):
    """The first index of the extreme, a NaN counting as the extreme (IREE's own
    lowering returned another index beside a NaN, and none for a 0-d tensor)."""
    if x.dim() == 0:
        return x.clone(), _no_index(x)
    if not x.dtype.is_floating_point or x.numel() == 0:
        return NotImplemented
    key = _order_key(x, nan_high=op is aten.max.dim)
    indices = op(key, dim, True)[1]
    return _pick(x, dim % x.dim(), indices, keepdim)


@register_decomposition(aten.mode.default)
def mode(op, x, dim=-1, keepdim=False):
    """The smallest of the most frequent values and its last position (eager's, for
    rows short enough that its sort keeps ties in order); NaNs are each their own
    value, as eager's comparisons make them."""
    if x.dim() == 0:
        return x.clone(), _no_index(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0 or x.numel() * n > _MAX_PAIRS:
        return NotImplemented
    rows = x.movedim(dim, -1)
    key = _order_key(rows).to(torch.int64)
    nan = torch.isnan(rows) if rows.dtype.is_floating_point else torch.zeros_like(key, dtype=torch.bool)
    same = (key.unsqueeze(-1) == key.unsqueeze(-2)) & ~nan.unsqueeze(-1)
    count = torch.where(nan, torch.ones_like(key), same.sum(-1))
    most = count.max(-1, keepdim=True)[0]
    candidate = torch.where(count == most, key, torch.full_like(key, torch.iinfo(torch.int64).max))
    chosen = candidate.min(-1, keepdim=True)[0]
    position = torch.arange(n, device=x.device).expand_as(key)
    index = torch.where(key == chosen, position, torch.full_like(position, -1)).max(-1, keepdim=True)[0]
    if rows.dtype.is_floating_point:
        # Every NaN its own value: when one is chosen, it is the first of them.
        first_nan = torch.where(nan, position, torch.full_like(position, n)).min(-1, keepdim=True)[0]
        index = torch.where(chosen == torch.iinfo(_BITS[rows.dtype]).max, first_nan, index)
    values, indices = _pick(rows, -1, index, True)
    values, indices = values.movedim(-1, dim), indices.movedim(-1, dim)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@register_decomposition(aten.cummax.default, aten.cummin.default)
def cumulative_extreme(op, x, dim):
    """A Hillis-Steele scan on (key, position): log2(n) steps, each taking the earlier
    half's pair only where its key is strictly larger, so a tie takes the later
    position as eager does; a NaN is the extreme, the latest NaN its index."""
    if x.dim() == 0:
        return x.clone(), _no_index(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        return x.clone(), torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    largest = op is aten.cummax.default
    key = _order_key(x, nan_high=largest).to(torch.int64)
    if not largest:
        key = torch.bitwise_not(key)
    index = _positions(x, dim).expand(x.shape)
    step = 1
    while step < n:
        pad = list(x.shape)
        pad[dim] = step
        before_key = torch.cat([torch.full(pad, torch.iinfo(torch.int64).min, dtype=torch.int64, device=x.device),
                                key.narrow(dim, 0, n - step)], dim)
        before_index = torch.cat([torch.zeros(pad, dtype=torch.int64, device=x.device), index.narrow(dim, 0, n - step)],
                                 dim)
        take = before_key > key
        key, index = torch.where(take, before_key, key), torch.where(take, before_index, index)
        step *= 2
    return torch.gather(x, dim, index), index


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


@register_decomposition(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
                        aten.scatter_add.default, aten.scatter_reduce.two)
def scatter_along_a_negative_dim(op, x, dim, *args, **kwargs):
    """iree-compile crashes (SIGSEGV in TorchToTMTensor) on a scatter along a negative
    dim, which the backward of every op here makes from the caller's dim=-1; and
    IREE has no lowering for scatter's `reduce=` forms, which are scatter_reduce's
    sum and prod with the destination included."""
    if x.dim() == 0:
        return NotImplemented
    if op in (aten.scatter.reduce, aten.scatter.value_reduce):
        index, src, reduce = args[0], args[1], kwargs.get("reduce", args[2] if len(args) > 2 else None)
        if reduce not in _SCATTER_REDUCE:
            return NotImplemented
        if op is aten.scatter.value_reduce:
            src = torch.full(index.shape, src, dtype=x.dtype, device=x.device)
        return aten.scatter_reduce.two(x, dim % x.dim(), index, src, _SCATTER_REDUCE[reduce], include_self=True)
    if dim >= 0:
        return NotImplemented
    return op(x, dim % x.dim(), *args, **kwargs)


def _log_add_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)) as eager's scan adds: max + log1p(exp(min - max)), and
    the infinity itself where both are the same infinity."""
    high, low = torch.maximum(a, b), torch.minimum(a, b)
    total = high + torch.log1p(torch.exp(low - high))
    return torch.where(torch.isinf(low) & (low == high), high, total)


@register_decomposition(aten.logcumsumexp.default)
def logcumsumexp(op, x, dim):
    """A Hillis-Steele scan of log-add-exp (float16 in float32, as eager accumulates);
    IREE's own lowering takes log(cumsum(exp(x))), infinite from x = 89 on."""
    if not x.dtype.is_floating_point:
        return NotImplemented
    if x.dim() == 0:
        return x.clone()
    dim = dim % x.dim()
    n = x.shape[dim]
    total = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    step = 1
    while step < n:
        pad = list(x.shape)
        pad[dim] = step
        before = torch.cat([torch.full(pad, -torch.inf, dtype=total.dtype, device=x.device),
                            total.narrow(dim, 0, n - step)], dim)
        total = _log_add_exp(before, total)
        step *= 2
    return total.to(x.dtype)


@register_decomposition(aten.unique_consecutive.default)
def unique_consecutive_of_one_element(op, x, return_inverse=False, return_counts=False, dim=None):
    """Only where the result's size is known while tracing: at most one element (one
    slice along `dim`) has itself as its one run; a longer input is left whole."""
    length = x.numel() if dim is None else x.shape[dim] if x.dim() else 1
    if length > 1:
        return NotImplemented
    values = x.reshape(-1).clone() if dim is None else x.clone()
    no_index = torch.zeros(0, dtype=torch.int64, device=x.device)
    inverse = torch.zeros(x.shape if dim is None else (length,), dtype=torch.int64, device=x.device)
    counts = torch.ones(length, dtype=torch.int64, device=x.device)
    return values, inverse if return_inverse else no_index, counts if return_counts else no_index


_SEGMENT_START = {"max": -torch.inf, "min": torch.inf, "sum": 0.0, "mean": 0.0, "prod": 1.0}


def _segment_members(data, lengths, offsets, axis):
    """(member, count): whether element j lies in segment s (segments x elements,
    broadcasting over the data's other dims), and each segment's length; None where
    the formulation does not apply."""
    bounds = lengths if lengths is not None else offsets
    if (bounds is None or bounds.dim() != 1 or axis != 0 or data.dim() == 0
            or not data.dtype.is_floating_point):
        return None
    if lengths is not None:
        ends = torch.cumsum(lengths, 0)
        starts, count = ends - lengths, lengths
    else:
        starts, ends = offsets[:-1], offsets[1:]
        count = ends - starts
    n = data.shape[0]
    if bounds.numel() * n * max(1, data[0].numel()) > _MAX_PAIRS:
        return None
    position = torch.arange(n, device=data.device)
    member = (starts.unsqueeze(1) <= position) & (position < ends.unsqueeze(1))
    trailing = (1,) * (data.dim() - 1)
    return member.view(member.shape + trailing), count.view(count.shape + trailing)


@register_decomposition(aten.segment_reduce.default)
def segment_reduce(op, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    """Each segment as a mask over the data (segments x elements), reduced as eager's
    loop does: from `initial` (or the reduction's identity), a NaN sticking in max/min,
    an empty segment's mean NaN without `initial`."""
    members = _segment_members(data, lengths, offsets, axis)
    if reduce not in _SEGMENT_START or indices is not None or members is None:
        return NotImplemented
    member, count = members
    rows = data.unsqueeze(0)
    start = torch.full((), _SEGMENT_START[reduce] if initial is None else initial, dtype=data.dtype,
                       device=data.device)
    if reduce in ("max", "min"):
        nan = (member & torch.isnan(rows)).sum(1) > 0
        fill = torch.full((), _SEGMENT_START[reduce], dtype=data.dtype, device=data.device)
        kept = torch.where(member & ~torch.isnan(rows), rows, fill)
        if reduce == "max":
            result = torch.maximum(kept.amax(1), start)
        else:
            result = torch.minimum(kept.amin(1), start)
        return torch.where(nan, torch.full_like(result, torch.nan), result)
    if reduce == "prod":
        return start * torch.where(member, rows, torch.ones_like(rows)).prod(1)
    total = start + torch.where(member, rows, torch.zeros_like(rows)).sum(1)
    if reduce == "sum":
        return total
    empty = torch.full_like(total, torch.nan) if initial is None else total
    return torch.where(count > 0, total / count.clamp(min=1).to(data.dtype), empty)


@register_decomposition(aten._segment_reduce_backward.default)
def segment_reduce_backward(op, grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """As eager's CPU kernel: max/min send the gradient to every element equal to the
    result (or NaN), divided among them only where it is positive; mean divides by
    the length."""
    members = _segment_members(data, lengths, offsets, axis)
    if reduce not in ("max", "min", "sum", "mean") or members is None:
        return NotImplemented
    member, count = members
    rows, share = data.unsqueeze(0), grad.unsqueeze(1)
    if reduce in ("max", "min"):
        member = member & (torch.isnan(rows) | (rows == output.unsqueeze(1)))
        hits = member.sum(1, keepdim=True)
        share = torch.where((hits > 1) & (share > 0), share / hits.clamp(min=1).to(share.dtype), share)
    elif reduce == "mean":
        share = share / count.unsqueeze(1).clamp(min=1).to(share.dtype)
    return torch.where(member, share, torch.zeros_like(share)).sum(0)
