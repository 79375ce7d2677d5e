"""tori.frontend.shared_heads: grouped-query attention's batched matmuls read the shared
key/value heads instead of their repeated copies; on traced ATen graphs (values
checked) and compiled end to end."""

import math

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tori
from tori.frontend.shared_heads import share_repeated_heads
from tori.testing import assert_matches_eager

aten = torch.ops.aten


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    # transformers' repeat_kv
    b, heads, length, dim = x.shape
    return x[:, :, None, :, :].expand(b, heads, groups, length, dim).reshape(b, heads * groups, length, dim)


def _attention(q, k, v, mask):
    """transformers' attention of a Llama layer: keys and values repeated per query head,
    the scale split between queries and keys."""
    groups = q.shape[1] // k.shape[1]
    return _of_repeats(q, _repeat_kv(k, groups), _repeat_kv(v, groups), mask)


def _of_repeats(q, keys, values, mask):
    scale = math.sqrt(1 / math.sqrt(q.shape[-1]))
    scores = torch.matmul(q * scale, (keys * scale).transpose(-2, -1)) + mask
    return torch.matmul(torch.softmax(scores, dim=-1), values)


def _inputs(length=3, cached=10):
    mask = torch.zeros(1, 1, length, cached).masked_fill(torch.rand(1, 1, length, cached) < 0.3, -math.inf)
    mask[..., 0] = 0.0
    return torch.randn(2, 8, length, 16), torch.randn(2, 2, cached, 16), torch.randn(2, 2, cached, 16), mask


def _clones(gm) -> int:
    return sum(n.target is aten.clone.default for n in gm.graph.nodes)


def test_both_matmuls_read_the_shared_heads():
    args = _inputs()
    gm = make_fx(_attention, tracing_mode="fake")(*args)
    assert _clones(gm) == 2  # the repeated keys and values
    assert share_repeated_heads(gm) == 2
    gm.graph.lint()
    assert _clones(gm) == 0, gm.code
    shapes = [list(n.meta["val"].shape) for n in gm.graph.nodes if n.target is aten.bmm.default]
    assert shapes == [[4, 12, 10], [4, 12, 16]]  # 2 images x 2 key/value heads, 4 query heads x 3 rows each
    torch.testing.assert_close(gm(*args), _attention(*args), rtol=1e-6, atol=1e-6)


def test_a_repeat_read_elsewhere_stays():
    def fn(q, k, v, mask):
        keys = _repeat_kv(k, 4)
        return _of_repeats(q, keys, _repeat_kv(v, 4), mask), keys.sum()

    args = _inputs()
    gm = make_fx(fn, tracing_mode="fake")(*args)
    # the keys' repeat has two readers; the values' does not
    assert share_repeated_heads(gm) == 1
    torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-6, atol=1e-6)


def test_grouped_query_attention_compiles_without_copies_of_the_heads():
    assert_matches_eager(_attention, *_inputs(length=1, cached=40), rtol=1e-5, atol=1e-5)
    aten_code = tori.last_compile().stages["aten"]
    assert "aten.clone" not in aten_code and aten_code.count("aten.bmm") == 2, aten_code


def test_one_key_value_head_is_read_once_for_every_query_head():
    # Multi-query attention: with one key/value head the repeat is a view of an expand
    # (no copy), which the batched matmuls read as one copy per query head: the keys
    # through a broadcast operand, the values through `aten.matmul`'s own clone.
    q, k, v, mask = _inputs(length=1, cached=40)
    args = (q, k[:, :1].contiguous(), v[:, :1].contiguous(), mask)
    gm = make_fx(_attention, tracing_mode="fake")(*args)
    assert _clones(gm) == 1
    assert share_repeated_heads(gm) == 2
    gm.graph.lint()
    assert _clones(gm) == 0, gm.code
    shapes = [list(n.meta["val"].shape) for n in gm.graph.nodes if n.target is aten.bmm.default]
    assert shapes == [[2, 8, 40], [2, 8, 16]]  # 2 images, 8 query heads x 1 row each
    torch.testing.assert_close(gm(*args), _attention(*args), rtol=1e-6, atol=1e-6)
    assert_matches_eager(_attention, *args, rtol=1e-5, atol=1e-5)
