"""Random sampling ops decomposed into uniform and normal samples
(tori.frontend.decomp.distributions): compiled natively, their large samples have
eager's dtypes, ranges and statistics (quantiles, means, frequencies)."""

import math

import torch

from tori.testing import count_graphs

N = 200_000
HALF_N = 100_000


def _compile_and_run(fn, *args):
    """fn compiled with fallback='error', its outputs and eager's; every graph ran compiled."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", fullgraph=True, options={"fallback": "error"})
    with count_graphs() as count:
        actual = compiled(*args)
    assert count.compiled_graphs >= 1 and count.compiled_calls >= 1, count.delta
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    torch.manual_seed(0)  # eager's sample, fixed: the tolerances are 4 standard errors or more
    expected = fn(*args)
    for a, e in zip(actual, expected):
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
    return actual, expected


def _quantiles(t, qs):
    return torch.quantile(t.double(), torch.tensor(qs, dtype=torch.float64))


def _frequencies(t, values):
    return torch.stack([(t == v).double().mean() for v in values])


def _assert_integers_in(t, low, high):
    if t.is_floating_point():
        assert torch.equal(t, torch.floor(t))
    assert t.min().item() >= low and t.max().item() <= high


def _scalar_distributions(x, half, ints):
    return (
        x.clone().cauchy_(1.0, 2.0),
        x.clone().log_normal_(0.5, 0.75),
        x.clone().geometric_(0.3),
        torch.normal(1.5, 0.5, x.shape),
        torch.randint_like(x, 3, 13),
        torch.randint_like(x, 10, dtype=torch.int64),
        half.clone().cauchy_(),
        half.clone().log_normal_(0.0, 0.5),
        half.clone().geometric_(0.6),
        torch.normal(-2.0, 3.0, half.shape, dtype=torch.float16),
        torch.randint_like(half, 2, 7),
        ints.clone().geometric_(0.3),
    )


def test_scalar_distributions_have_eagers_quantiles_moments_and_ranges():
    x, half, ints = torch.empty(N), torch.empty(HALF_N, dtype=torch.float16), torch.empty(HALF_N, dtype=torch.int32)
    actual, expected = _compile_and_run(_scalar_distributions, x, half, ints)
    (cauchy, log_normal, geometric, normal, randint, randint64,
     cauchy16, log_normal16, geometric16, normal16, randint16, geometric_int) = actual

    # Cauchy(1, 2): median 1, quartiles 1 -+ 2; the standard one's quartiles -+1.
    quartiles = [0.25, 0.5, 0.75]
    torch.testing.assert_close(_quantiles(cauchy, quartiles), _quantiles(expected[0], quartiles), rtol=0, atol=0.08)
    torch.testing.assert_close(_quantiles(cauchy, quartiles), torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64),
                               rtol=0, atol=0.08)
    torch.testing.assert_close(_quantiles(cauchy16.float(), quartiles), torch.tensor([-1.0, 0.0, 1.0],
                               dtype=torch.float64), rtol=0, atol=0.06)
    assert cauchy.abs().max() > 1e4  # the heavy tails are there

    # log of a log-normal sample is normal with the given mean and std.
    for sample, reference, mean, std in ((log_normal, expected[1], 0.5, 0.75), (log_normal16, expected[7], 0.0, 0.5)):
        assert sample.min() > 0
        logs = torch.log(sample.double())
        assert abs(logs.mean().item() - mean) < 0.01 and abs(logs.std().item() - std) < 0.01
        assert abs(logs.mean().item() - torch.log(reference.double()).mean().item()) < 0.015

    for sample, reference, mean, std in ((normal, expected[3], 1.5, 0.5), (normal16, expected[9], -2.0, 3.0)):
        sample = sample.double()
        assert abs(sample.mean().item() - mean) < 0.015 * std and abs(sample.std().item() - std) < 0.01 * std
        assert abs(sample.mean().item() - reference.double().mean().item()) < 0.02 * std

    # Geometric(p): trials up to the first success, P(k) = (1 - p)^(k - 1) p for k >= 1.
    for sample, reference, p in ((geometric, expected[2], 0.3), (geometric16, expected[8], 0.6),
                                 (geometric_int, expected[11], 0.3)):
        _assert_integers_in(sample, 1, math.inf)
        ks = range(1, 6)
        law = torch.tensor([(1 - p) ** (k - 1) * p for k in ks], dtype=torch.float64)
        torch.testing.assert_close(_frequencies(sample, ks), law, rtol=0, atol=0.008)
        torch.testing.assert_close(_frequencies(sample, ks), _frequencies(reference, ks), rtol=0, atol=0.011)
        assert abs(sample.double().mean().item() - 1 / p) < 0.03 / p

    # randint_like: every integer of [low, high) equally often, none outside.
    for sample, reference, low, high in ((randint, expected[4], 3, 13), (randint64, expected[5], 0, 10),
                                         (randint16, expected[10], 2, 7)):
        _assert_integers_in(sample, low, high - 1)
        values = range(low, high)
        uniform = torch.full((high - low,), 1 / (high - low), dtype=torch.float64)
        torch.testing.assert_close(_frequencies(sample, values), uniform, rtol=0, atol=0.006)
        torch.testing.assert_close(_frequencies(sample, values), _frequencies(reference, values), rtol=0, atol=0.009)


def _multinomials(rows, weights, half):
    return (
        torch.multinomial(rows, 20_000, replacement=True),
        torch.multinomial(half, 20_000, replacement=True),
        torch.multinomial(weights, 5),
        torch.multinomial(weights, 8, replacement=False),
    )


def test_multinomial_draws_by_the_weights_and_without_replacement_distinct_indices():
    rows = torch.tensor([[0.1, 0.0, 0.3, 0.6, 0.0], [1.0, 1.0, 0.0, 0.0, 2.0]])
    half = torch.tensor([0.0, 3.0, 1.0, 0.0], dtype=torch.float16)
    row = torch.tensor([0.5, 0.0, 1.0, 0.0, 2.0, 0.0, 0.25, 3.0])
    weights = row.expand(20_000, 8).contiguous()
    actual, expected = _compile_and_run(_multinomials, rows, weights, half)
    with_rows, with_half, five, eight = actual
    assert all(t.dtype == torch.int64 for t in actual)

    # With replacement: frequencies are the normalized weights; zero weights never drawn.
    for drawn, reference, w in ((with_rows[0], expected[0][0], rows[0]), (with_rows[1], expected[0][1], rows[1]),
                                (with_half, expected[1], half.float())):
        categories = range(len(w))
        frequencies = _frequencies(drawn, categories)
        torch.testing.assert_close(frequencies, (w / w.sum()).double(), rtol=0, atol=0.018)
        torch.testing.assert_close(frequencies, _frequencies(reference, categories), rtol=0, atol=0.025)
        assert not torch.isin(drawn, torch.nonzero(w == 0).flatten()).any()

    # Without replacement: distinct indices in each row; the 5 positive weights
    # first (the first draw by the normalized weights), the 3 zero weights only after.
    positive, zero = torch.nonzero(row > 0).flatten(), torch.nonzero(row == 0).flatten()
    assert torch.equal(five.sort(dim=1).values, positive.expand(20_000, 5))
    assert torch.equal(eight.sort(dim=1).values, torch.arange(8).expand(20_000, 8))
    assert torch.equal(eight[:, 5:].sort(dim=1).values, zero.expand(20_000, 3))
    categories = range(8)
    for drawn, reference in ((five, expected[2]), (eight, expected[3])):
        first = _frequencies(drawn[:, 0], categories)
        torch.testing.assert_close(first, (row / row.sum()).double(), rtol=0, atol=0.018)
        for position in range(4):  # later draws follow eager's law too
            torch.testing.assert_close(_frequencies(drawn[:, position], categories),
                                       _frequencies(reference[:, position], categories), rtol=0, atol=0.025)


def test_randint_like_wider_than_float32_resolves_is_left_to_fail():
    from tori.frontend.decomp.distributions import randint_like

    op = torch.ops.aten.randint_like.low_dtype
    assert randint_like(op, torch.empty(3, dtype=torch.int64), -2**40, 2**40) is NotImplemented
    assert randint_like(op, torch.empty(3, dtype=torch.int64), 0, 2**24) is not NotImplemented
