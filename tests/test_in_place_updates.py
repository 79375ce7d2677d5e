"""Inputs a graph only overwrites rows of (a static KV cache's index_copy_) are passed to
IREE in place: it writes the new rows into the caller's tensor, which is handed back
to AOTAutograd as the new value, so no copy of it is made per call. Compared with
eager over several calls, the caller's tensors included."""

import pytest
import torch

import tori
from tori.frontend.signature import ArgKind


def _kinds() -> list[ArgKind]:
    return list(tori.last_compile().forward.compiled.signature.args)


def _step(cache_k, cache_v, position, k, v, q):
    """One decoding step of a static cache: write this token's row, attend over all rows."""
    cache_k.index_copy_(1, position, k)
    cache_v.index_copy_(1, position, v)
    weights = torch.softmax(q @ cache_k.transpose(-2, -1), dim=-1)
    return weights @ cache_v


def _run(fn, caches, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    outs = []
    for position in range(steps):
        k, v, q = (torch.randn(2, 1, 8, generator=generator) for _ in range(3))
        outs.append(fn(*caches, torch.tensor([position]), k, v, q))
    return outs


def test_a_static_cache_is_updated_in_place_and_matches_eager():
    expected_caches = [torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)]
    expected = _run(_step, expected_caches, 5)
    caches = [torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)]
    addresses = [c.data_ptr() for c in caches]
    compiled = torch.compile(_step, backend="tori", options={"fallback": "error", "cache": False})
    with tori.testing.count_graphs() as count:
        actual = _run(compiled, caches[:], 1)
        # the next five calls (the first again, then four): the new caches handed back are
        # the caller's tensors themselves
        graph = tori.last_compile().forward.compiled
        handed_back, run = [], graph._run

        def recording(module, args):
            outputs = run(module, args)
            handed_back.extend(outputs[position] is args[r.updates]
                               for position, r in enumerate(graph.signature.results) if r.updates is not None)
            return outputs

        graph._run = recording
        actual += _run(compiled, caches, 5)[1:]
    assert count.compiled_graphs == 1 and count.delta.fallback_calls == 0
    assert _kinds().count(ArgKind.UPDATED_TENSOR) == 2
    assert handed_back == [True] * 10
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    for a, e in zip(caches, expected_caches):
        torch.testing.assert_close(a, e)
    assert [c.data_ptr() for c in caches] == addresses


def test_a_cache_read_before_its_update_is_passed_as_a_copy():
    def step(cache, position, row):
        before = cache.sum()  # reads the old rows: IREE may not overwrite them first
        cache.index_copy_(0, position, row)
        return before, cache * 2

    expected_cache, cache = torch.randn(6, 3), None
    cache = expected_cache.clone()
    compiled = torch.compile(step, backend="tori", options={"fallback": "error", "cache": False})
    for position in range(3):
        row = torch.randn(1, 3)
        expected = step(expected_cache, torch.tensor([position]), row)
        actual = compiled(cache, torch.tensor([position]), row)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(cache, expected_cache)
    assert ArgKind.UPDATED_TENSOR not in _kinds()


def test_an_accumulating_update_is_passed_as_a_copy():
    def step(counts, index, amounts):
        counts.index_put_((index,), amounts, accumulate=True)
        return counts.sum()

    expected_counts, counts = torch.zeros(5), torch.zeros(5)
    compiled = torch.compile(step, backend="tori", options={"fallback": "error", "cache": False})
    for _ in range(3):
        index, amounts = torch.tensor([1, 3, 1]), torch.randn(3)
        torch.testing.assert_close(compiled(counts, index, amounts), step(expected_counts, index, amounts))
        torch.testing.assert_close(counts, expected_counts)
    assert ArgKind.UPDATED_TENSOR not in _kinds()


def test_a_position_outside_the_cache_raises_and_leaves_it_as_it_was():
    caches = [torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)]
    compiled = torch.compile(_step, backend="tori", options={"fallback": "error", "cache": False})
    _run(compiled, caches, 3)
    assert _kinds().count(ArgKind.UPDATED_TENSOR) == 2
    before = [c.clone() for c in caches]
    k, v, q = torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    for position in (16, 40):
        with pytest.raises(IndexError, match="index out of range in index_copy"):
            compiled(*caches, torch.tensor([position]), k, v, q)
        for cache, old in zip(caches, before):
            assert torch.equal(cache, old)
