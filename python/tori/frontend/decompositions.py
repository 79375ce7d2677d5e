"""Decompositions applied while AOTAutograd traces (the `aten` stage).

The base is Torch-MLIR's table for its importer; tori's own entries, one function
and one decorator each, cover ops that Torch-MLIR imports but IREE lowers wrongly
(precision) or not at all.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import threading
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


@functools.lru_cache(maxsize=2)
def decomposition_table(runtime_checks: bool = True) -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    import tori.frontend.decomp  # noqa: F401  (the op families register their entries)

    from tori.frontend.decomp import checks, degenerate, half_precision

    base = get_decomposition_table()
    table = {**base, **{op: _chained(op, fn, base.get(op)) for op, fn in _TORI.items()}}
    # Reductions and scans of a 0-d tensor on its 1-element view (IREE lowers some
    # 0-d forms without end, or crashes).
    table = degenerate.wrap(table)
    # 16-bit float ops in float32 as eager computes them (a 4096-element float16 sum
    # accumulated in float16 by IREE was off by 23.5): around every other entry;
    # indexing and integer division behind checks of their operands, in front of everything.
    table = half_precision.wrap(table)
    return checks.wrap(table) if runtime_checks else table


@functools.lru_cache(maxsize=2)
def export_table(runtime_checks: bool = True) -> dict:
    """The table for `ExportedProgram.run_decompositions`: tori's, and for every
    composite op (CompositeImplicitAutograd) not in it, its own decomposition.
    AOTAutograd's trace decomposes composites by itself; `run_decompositions` with a
    table keeps every composite the table lacks (isfinite reached IREE undecomposed
    and failed to lower in exported modules only)."""
    from torch._export.utils import _collect_all_valid_cia_ops, _get_decomp_for_cia

    table = decomposition_table(runtime_checks)
    composites = {op: _get_decomp_for_cia(op) for op in _collect_all_valid_cia_ops() if op not in table}
    return {**composites, **table}


# The options of the graph being traced, for decompositions whose best form depends on
# the code generation the graph will get (frontend/decomp/grouped_conv.py).
_OPTIONS: contextvars.ContextVar = contextvars.ContextVar("tori_compile_options", default=None)
# ...and the graph Dynamo captured, before any decomposition (its ops and their example values).
_GRAPH: contextvars.ContextVar = contextvars.ContextVar("tori_captured_graph", default=None)


@contextlib.contextmanager
def tracing_for(options, graph: torch.fx.GraphModule | None = None):
    """Decompositions in this block trace `graph` (Dynamo's, where given), to be
    compiled with `options`."""
    tokens = _OPTIONS.set(options), _GRAPH.set(graph)
    try:
        yield
    finally:
        _OPTIONS.reset(tokens[0])
        _GRAPH.reset(tokens[1])


def traced_options():
    """The options of the graph being traced (`tracing_for`), None outside such a trace."""
    return _OPTIONS.get()


def traced_graph() -> torch.fx.GraphModule | None:
    """Dynamo's graph being traced (`tracing_for`), None where none was given."""
    return _GRAPH.get()


# Ops traced as they are (`as_is`) in the current trace: their tori entries step aside.
_AS_IS: contextvars.ContextVar[frozenset] = contextvars.ContextVar("tori_as_is", default=frozenset())


def as_is(op, *args, **kwargs):
    """`op` traced without tori's decomposition of it, for a decomposition that fixes
    up the op's own result (pow of |x|, then the sign)."""
    token = _AS_IS.set(_AS_IS.get() | {op})
    try:
        return op(*args, **kwargs)
    finally:
        _AS_IS.reset(token)


def _chained(op, fn: Callable, fallback: Callable | None) -> Callable:
    # A tori decomposition returns NotImplemented where it does not apply; then the
    # base table's entry (if any) decides, as it would without tori.
    def decompose(*args, **kwargs):
        result = NotImplemented if op in _AS_IS.get() else fn(op, *args, **kwargs)
        if result is NotImplemented and fallback is not None:
            return fallback(*args, **kwargs)
        return result

    return decompose


# IREE's own gelu(approximate='tanh') is off by up to 5e-5 in float32.
register_decomposition(aten.gelu.default)(lambda op, *a, **k: aten_decompositions[op](*a, **k))

# where(c, a, a) is `a` broadcast to c's shape; Torch-MLIR's folder returned `a` itself,
# and iree-compile failed on the function's result type (found by the fuzzer).
@register_decomposition(aten.where.self)
def _where_of_one_value(op, condition, a, b):
    if a is not b:
        return NotImplemented
    return a.expand(torch.broadcast_shapes(condition.shape, a.shape))


# A sum of bools is a bool: eager's True + True is True (an or); IREE added the i1
# values and kept the low bit (False; found by `make fuzz`, values, seed 1).
@register_decomposition(aten.add.Tensor, aten.add.Scalar)
def _sum_of_bools(op, a, b, *, alpha=1):
    if not isinstance(a, torch.Tensor) or torch.result_type(a, b) != torch.bool:
        return NotImplemented
    if isinstance(b, torch.Tensor):
        return torch.logical_or(a, b if alpha else b & False)
    return torch.logical_or(a, torch.full_like(a, bool(b) and bool(alpha), dtype=torch.bool))


# IREE lowers the named shift ops but not the Python operators `<<`, `>>` on tensors.
register_decomposition(aten.__lshift__.Tensor)(lambda op, *a, **k: aten.bitwise_left_shift.Tensor(*a, **k))
register_decomposition(aten.__rshift__.Tensor)(lambda op, *a, **k: aten.bitwise_right_shift.Tensor(*a, **k))

def _attention_mask(mask, mask_type, batch: int, heads: int, length: int):
    """The fused kernels' merged mask as an additive (batch, heads, L, L) float mask."""
    if mask is None:
        return None
    if mask_type == 1:  # key padding: (batch, L)
        mask = mask.view(batch, 1, 1, length)
    if mask.dtype == torch.bool:  # True marks a position that must not be attended to
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.expand(batch, heads, length, length)


def _fused_self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    batch, length, embed = x.shape
    q, k, v = torch.nn.functional.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
    q, k, v = (t.reshape(batch, length, num_heads, embed // num_heads).transpose(1, 2) for t in (q, k, v))
    attn_mask = _attention_mask(mask, mask_type, batch, num_heads, length)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return torch.nn.functional.linear(out.transpose(1, 2).reshape(batch, length, embed), proj_weight, proj_bias)


@register_decomposition(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer(op, src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                              use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                              ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path, a fused kernel IREE has no
    lowering for, as the attention, LayerNorm and feed-forward ops it is made of."""
    if src.dim() != 3 or src.is_nested:
        return NotImplemented
    F = torch.nn.functional

    def attend(x):
        return _fused_self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    if norm_first:
        x = src + attend(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attend(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


@register_decomposition(aten._native_multi_head_attention.default)
def multi_head_self_attention(op, query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                              proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """nn.MultiheadAttention's inference fast path (self-attention, no weights returned)."""
    if need_weights or query is not key or key is not value or query.dim() != 3:
        return NotImplemented
    out = _fused_self_attention(query, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    return out, torch.empty(0, dtype=out.dtype, device=out.device)


def _nan_if_either(a, b, chosen):
    # a + b is NaN wherever a or b is; elsewhere `chosen` stands.
    return torch.where(torch.isnan(a) | torch.isnan(b), a + b, chosen)


@register_decomposition(aten.maximum.default, aten.minimum.default)
def nan_propagating_max_min(op, a, b):
    """IREE's float maximum/minimum return the other operand where the first is NaN
    (maximum(NaN, 0.0) gave 0.0; found by the fuzzer, docs/limitations.md); eager
    returns NaN when either operand is NaN."""
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return NotImplemented
    a, b = a.to(dtype), b.to(dtype)
    chosen = torch.where(a > b if op is aten.maximum.default else a < b, a, b)
    return _nan_if_either(a, b, chosen)


@register_decomposition(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default)
def nan_keeping_clamp(op, x, low=None, high=None):
    """clamp of NaN is NaN in eager; IREE's clamp returned the bound (found by the fuzzer)."""
    if not x.dtype.is_floating_point or isinstance(low, torch.Tensor) or isinstance(high, torch.Tensor):
        return NotImplemented
    if op is aten.clamp_max.default:
        low, high = None, low
    result = x
    if low is not None:
        result = torch.where(result < low, torch.full_like(x, low), result)
    if high is not None:
        result = torch.where(result > high, torch.full_like(x, high), result)
    return result


@register_decomposition(aten.hardtanh.default)
def nan_keeping_hardtanh(op, x, min_val=-1.0, max_val=1.0):
    """hardtanh (and relu6) are clamps: NaN stays NaN, as in eager."""
    return nan_keeping_clamp(aten.clamp.default, x, min_val, max_val)


_IN_ATAN2 = threading.local()


@register_decomposition(aten.atan2.default)
def atan2_of_infinities_and_zeros(op, y, x):
    """IREE's atan2 is NaN where both operands are infinite or both zero, and ignores
    the sign of y where y is zero or x infinite (atan2(-0.0, -1.0) and atan2(-1.0, -inf)
    gave +π); found by the fuzzer. Eager gives atan2 of the signs for two infinities,
    and ±0 or ±π (by the signs of y and x) for a zero y or an infinite x."""
    if getattr(_IN_ATAN2, "active", False):
        return NotImplemented  # the atan2 below: the op itself
    dtype = torch.result_type(y, x)
    if not dtype.is_floating_point:
        return NotImplemented
    y, x = y.to(dtype), x.to(dtype)
    both = torch.isinf(y) & torch.isinf(x)
    _IN_ATAN2.active = True
    try:
        result = op(torch.where(both, torch.sign(y), y), torch.where(both, torch.sign(x), x))
    finally:
        _IN_ATAN2.active = False
    # signbit and copysign themselves do not compile in IREE (a torch.constant.int is left).
    on_axis = torch.where(_sign_bit(x), torch.full_like(x, math.pi), torch.zeros_like(x))
    on_x_axis = ((y == 0) | (torch.isinf(x) & _finite(y))) & ~torch.isnan(x)
    return torch.where(on_x_axis, torch.where(_sign_bit(y), -on_axis, on_axis), result)


def _sign_bit(t):
    # -0.0 is told from 0.0 by the sign of its reciprocal.
    return (t < 0) | ((t == 0) & (torch.reciprocal(t) < 0))


def _finite(t):
    # An ordered comparison: false for NaN as for infinities.
    return torch.abs(t) < math.inf


@register_decomposition(aten.eq.Tensor, aten.le.Tensor, aten.ge.Tensor)
def self_comparison(op, a, b):
    """`x == x` (also <=, >=) compiled to true even where x is NaN (found by the
    fuzzer through isfinite, which eager composes from x == x); eager's is false there."""
    if a is not b or not a.dtype.is_floating_point:
        return NotImplemented
    return ~torch.isnan(a)


@register_decomposition(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def attention_backward(op, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                       attn_mask=None, scale=None):
    """Training through scaled_dot_product_attention on the CPU: AOTAutograd's backward
    graph holds this op, which IREE does not lower. Written as matmuls and the softmax
    derivative, with the probabilities recomputed from the query and key."""
    if dropout_p != 0.0:
        return NotImplemented
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    groups = query.shape[-3] // key.shape[-3]  # grouped-query attention shares key/value heads
    keys = key.repeat_interleave(groups, dim=-3) if groups > 1 else key
    values = value.repeat_interleave(groups, dim=-3) if groups > 1 else value
    scores = (query @ keys.transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    grad_values = probs.transpose(-2, -1) @ grad_out
    grad_scores = probs * (grad_out @ values.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
    grad_query = (grad_scores @ keys) * scale
    grad_keys = (grad_scores.transpose(-2, -1) @ query) * scale
    if groups > 1:
        grad_keys = grad_keys.unflatten(-3, (key.shape[-3], groups)).sum(-3)
        grad_values = grad_values.unflatten(-3, (value.shape[-3], groups)).sum(-3)
    return grad_query, grad_keys, grad_values


@register_decomposition(aten.native_layer_norm.default)
def layer_norm_in_float32(op, x, normalized_shape, weight, bias, eps):
    """LayerNorm's moments as two float32 reductions, as eager's CPU kernel computes them.
    PyTorch's decomposition goes through var_mean, which Torch-MLIR lowers in float64
    (two float64 reductions per LayerNorm: 3.6 of DeiT-small's dispatch time per layer)."""
    if x.dtype != torch.float32 or not normalized_shape:
        return NotImplemented
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    rstd = torch.rsqrt((centered * centered).mean(dims, keepdim=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd
