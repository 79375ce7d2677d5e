"""scaled_dot_product_attention on the CPU as two matmuls around a softmax whose
normalization waits until after the second matmul, as flash attention computes it:

    x = scores * scale (+ mask)      m = rowmax(x)      e = exp(x - m)
    [o | t] = e @ [v | 1]            out = o * (1 / t)  logsumexp = m + log(t)

PyTorch's decomposition (the math path) scales both operands, then runs the safe
softmax: `_softmax`, which IREE lowers to one dispatch that computes each row's
exponentials twice, with a scalar accumulator where the row's length is not a multiple
of the vector width (197 for DeiT), and an `all(scores == -inf)` check with a `where`
over every probability. DeiT-small's attention at 8 images (8x6x197x64, 2 cores):
14.0 ms through the math path, 8.3 with these ops (eager's fused kernel 2.7). The
division by the row sums moves onto the output, 64 values per row instead of 197.

The row sums t come out of the second matmul, as a last column of ones appended to v:
then the exponentials have one use, the matmul, and IREE packs them for it in the
dispatch that computes them rather than in a copy of its own. DeiT-small at 8 images
(197 keys): the packing 29.7 ms per call (12 layers) and the sums 5.4, against 11.3
more in the exponentials' dispatch and 2.5 for appending the column; the whole model
471.1 -> 414.6 ms (eager 319-325). Fewer than MATMUL_SUM_ROWS query rows per key/value
head (a decoding step's few rows against a cache) keep `rowsum(e)`: appending the
column would copy the whole value cache on every step.

Where no mask is given the scale is applied inside the exponential, `exp((s - m) *
scale)`, which needs no pass over the scores of its own (the maximum of the scaled
scores is the scaled maximum for a positive scale).

A fully masked row (every score -inf) attends to nothing: its maximum is taken as 0,
its exponentials are 0, and its output and logsumexp are 0, as eager's kernel returns.
Shared key/value heads (`enable_gqa`) are not repeated: the query heads that share a
key/value head stack their rows into one matrix against it.

Applies to float32 attention without dropout traced for a pipeline without
tori-fuse-attention, which matches the math path's ops to hand the GPU targets IREE's
fused attention kernel; elsewhere PyTorch's decomposition applies.
"""

from __future__ import annotations

import math

import torch

from tori.frontend.decomp.softmax import keeps_pytorchs_attention
from tori.frontend.decompositions import register_decomposition, traced_options
from tori.passes.packed_attention import MIN_KEYS, MIN_ROWS

aten = torch.ops.aten

MATMUL_SUM_ROWS = 16


def _applies(query, key, value, dropout_p) -> bool:
    if keeps_pytorchs_attention():
        return False
    if dropout_p != 0.0 or any(t.dtype != torch.float32 or t.dim() != 4 for t in (query, key, value)):
        return False
    same_batch = query.shape[0] == key.shape[0] == value.shape[0]
    same_keys = key.shape[1:3] == value.shape[1:3] and key.shape[-1] == query.shape[-1]
    return same_batch and same_keys and key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0


def _packed_lanes() -> int:
    """The query rows of tori-packed-attention's tiles for the graph being traced, 0
    where that pass does not run."""
    from tori.targets.codegen import packed_attention_lanes

    options = traced_options()
    return packed_attention_lanes(options) if options is not None else 0


def _grouped_mask(mask: torch.Tensor, kv_heads: int, group: int):
    """`mask` (broadcastable to [B, Hq, L, S]) broadcastable to the grouped scores
    [B, Hkv, group, L, S]."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.reshape(mask.shape[0], kv_heads, group, *mask.shape[2:])


@register_decomposition(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_for_cpu(op, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if not _applies(query, key, value, dropout_p):
        return NotImplemented
    batch, heads, length, width = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(width) if scale is None else float(scale)
    # The query heads of one key/value head are consecutive: their rows stack.
    rows = query.reshape(batch, kv_heads, group * length, width)
    masked = attn_mask is not None or is_causal
    stacked = group * length
    lanes = _packed_lanes() if not masked and scale > 0 and stacked >= MIN_ROWS and keys >= MIN_KEYS else 0
    if lanes:  # tori-packed-attention's form: whole tiles of scaled queries
        rows = rows * scale
        if stacked % lanes:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, lanes - stacked % lanes))
    scores = rows @ key.transpose(-2, -1)  # [B, Hkv, group * L (padded), S]
    if masked or scale <= 0:
        scores = scores * scale
    if masked:
        grouped = scores.view(batch, kv_heads, group, length, keys)
        if is_causal:
            rows_at = torch.arange(length, device=query.device).unsqueeze(-1)
            keep = torch.arange(keys, device=query.device) <= rows_at
            grouped = torch.where(keep, grouped, -math.inf)
        if attn_mask is not None:
            mask = _grouped_mask(attn_mask, kv_heads, group)
            grouped = torch.where(mask, grouped, -math.inf) if mask.dtype == torch.bool else grouped + mask
        scores = grouped.view(batch, kv_heads, group * length, keys)
    peak = torch.amax(scores, -1, keepdim=True)
    if not lanes:  # a fully masked row (none without a mask: tori-packed-attention reads the maxima as they are)
        peak = torch.where(peak == -math.inf, 0.0, peak)
    shifted = scores - peak
    weights = torch.exp(shifted if masked or scale <= 0 or lanes else shifted * scale)
    if lanes:  # tori-packed-attention's form: the matmul, then the row sums
        out, total = weights @ value, weights.sum(-1, keepdim=True)
        out, total, peak = out[..., :stacked, :], total[..., :stacked, :], peak[..., :stacked, :]
    elif stacked >= MATMUL_SUM_ROWS:
        ones = torch.ones(*value.shape[:-1], 1, dtype=value.dtype, device=value.device)
        both = weights @ torch.cat([value, ones], -1)  # the outputs, then the row sums
        out, total = both[..., :-1], both[..., -1:]
    else:
        out, total = weights @ value, weights.sum(-1, keepdim=True)
    empty = total == 0
    out = out * torch.where(empty, 0.0, torch.reciprocal(total))
    scaled_peak = peak if masked or scale <= 0 or lanes else peak * scale
    logsumexp = torch.where(empty, 0.0, scaled_peak + torch.log(total))
    return out.reshape(batch, heads, length, value.shape[-1]), logsumexp.reshape(batch, heads, length)
