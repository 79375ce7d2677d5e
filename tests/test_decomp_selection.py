"""Sorting, selection and scans (tori.frontend.decomp.selection): NaN, ties, -0.0,
repeated sorts in one graph and 0-d tensors, where IREE's own lowerings were wrong
or refused, compared with eager; float32 and float16 in one graph each."""

import torch

from tori.testing import assert_matches_eager, count_graphs

NAN, INF = float("nan"), float("inf")
SPECIAL = [3., 1., NAN, 1., 2., -INF, 3., 1., -0.0, 0.0, INF, NAN, -2.]


def both(values):
    return torch.tensor(values), torch.tensor(values, dtype=torch.float16)


def test_sort_orders_nan_last_and_keeps_ties_in_order():
    # IREE's sort compared with `olt`: a NaN stayed in place.
    def sorts(t):
        return torch.sort(t), torch.sort(t, descending=True), torch.argsort(t, stable=True, descending=True)

    assert_matches_eager(lambda a, b: (sorts(a), sorts(b)), *both(SPECIAL))


def test_two_sorts_in_one_graph_keep_their_own_indices():
    # IREE shared the index seed of two sorts of one shape: one got the other's permutation.
    a, b = torch.randn(5, 10, 5), torch.randn(5, 10, 5)
    assert_matches_eager(lambda s, t: (torch.sort(s, 1), torch.sort(t, 1), torch.topk(s, 3, 1), torch.topk(t, 3, -2)),
                         a, b)


def test_stable_sort_of_other_dtypes_0d_and_empty():
    ties = torch.randint(0, 4, (3, 37))
    assert_matches_eager(
        lambda i, f, b, s, e: (torch.sort(i, dim=1, stable=True), torch.sort(i.int(), dim=0, stable=True, descending=True),
                               torch.sort(f, stable=True), torch.sort(b, stable=True), torch.sort(s, stable=True),
                               torch.sort(e, dim=0, stable=True)),
        ties, ties.double(), ties > 1, torch.tensor(2.0), torch.empty(0, 3))


def test_topk_and_kthvalue_rank_nan_highest():
    rows = [[3., NAN, 1., 2., -INF, 0.5, INF], [1., 2., 3., 4., 5., 6., 7.]]

    def select(t):
        return torch.topk(t, 3), torch.topk(t, 2, largest=False), torch.kthvalue(t, 7), torch.kthvalue(t, 2, 0, True)

    assert_matches_eager(lambda a, b: (select(a), select(b)), *both(rows))


def test_max_min_over_a_dim_index_the_first_nan():
    # IREE's max.dim returned another index than the NaN's, and refused a 0-d tensor.
    rows = [[1., NAN, 3., NAN], [2., 2., 1., 2.], [-0.0, 0.0, -1., -2.]]

    def extremes(t):
        return torch.max(t, 1), torch.min(t, 1, keepdim=True), torch.max(t[0, 0], 0), torch.min(t[1, 1], -1)

    assert_matches_eager(lambda a, b: (extremes(a), extremes(b)), *both(rows))


def test_median_and_nanmedian():
    rows = [[1., NAN, 3., NAN, 2.], [5., 4., 1., 3., 2.], [2., NAN, 1., 0., 7.]]

    def medians(t):
        return (torch.median(t), torch.median(t, 1), torch.nanmedian(t), torch.nanmedian(t, 1), torch.median(t[1]),
                torch.median(t[0, 0]))

    assert_matches_eager(lambda a, b: (medians(a), medians(b)), *both(rows))


def test_mode_picks_the_smallest_most_frequent_value_and_its_last_index():
    x = torch.tensor([[2., 1., 2., 1., 3.], [1., NAN, 3., NAN, 2.], [NAN] * 5, [5., 4., 3., 2., 1.]])
    assert_matches_eager(lambda t, i: (torch.mode(t), torch.mode(i, 0, keepdim=True)), x, torch.randint(0, 3, (7, 4)))


def test_cummax_cummin_take_the_latest_tie_and_nan():
    rows = [[1., NAN, 3., NAN, 2., 3., 0.], [1., 3., 1., 0., 0., -0.0, 1.], [2., 2., 1., 1., 3., 3., 2.]]

    def scans(t):
        return torch.cummax(t, 1), torch.cummin(t, -1), torch.cummax(t[0, 0], 0)

    assert_matches_eager(lambda a, b: (scans(a), scans(b)), *both(rows))


def test_logcumsumexp_of_large_and_infinite_values():
    # IREE's own lowering took log(cumsum(exp(x))): infinite from x = 89 on.
    rows = [[1e4, 1e4, -INF, -INF, 2., INF, -1e3, NAN, 3.], [-INF, -INF, -1e3, -1e3, 0., 1., 2., 3., 4.]]
    assert_matches_eager(lambda a, b, s: (torch.logcumsumexp(a, 1), torch.logcumsumexp(b, -1),
                                          torch.logcumsumexp(s, 0)), *both(rows), torch.tensor(1.5))


def test_segment_reduce_by_lengths_and_offsets():
    data = torch.tensor([1., NAN, 3., -2., 5., 0.5, 7.])
    lengths, offsets = torch.tensor([2, 0, 3, 2]), torch.tensor([0, 2, 2, 5, 7])

    def reduce(d, l, o):
        return [(torch.segment_reduce(d, how, lengths=l), torch.segment_reduce(d, how, offsets=o, initial=1.5))
                for how in ("max", "min", "sum", "mean", "prod")]

    assert_matches_eager(reduce, data, lengths, offsets)


def test_unique_consecutive_of_one_element():
    # Its output size depends on the values: Dynamo captures it only with fullgraph.
    def unique(t):
        return torch.unique_consecutive(t, return_inverse=True, return_counts=True)

    x = torch.tensor(1.5)
    compiled = torch.compile(unique, backend="tori", fullgraph=True, options={"fallback": "error"})
    with count_graphs() as count:
        actual = compiled(x)
    torch.testing.assert_close(actual, unique(x))
    assert count.compiled_calls == 1 and count.fallback_calls == 0


def test_scatter_along_a_negative_dim_and_with_reduce():
    # iree-compile crashed on a negative dim (the backward of topk(dim=-1) makes one),
    # and had no lowering for reduce="add"/"multiply".
    index = torch.tensor([[0, 2, 0], [1, 3, 1]])
    assert_matches_eager(lambda z, s: (torch.scatter(z, -1, index, s), torch.scatter_add(z, -1, index, s),
                                       torch.scatter(z, 1, index, s, reduce="add"),
                                       torch.scatter(z, -1, index, 2.0, reduce="multiply")),
                         torch.randn(2, 5), torch.randn(2, 4))


def test_selection_ops_train():
    x = torch.randn(4, 9, requires_grad=True)

    def loss(t):
        return (torch.sort(t)[0][:, :3].sum() + torch.topk(t, 2)[0].sum() + torch.max(t, 0)[0].sum()
                + torch.cummax(t, -1)[0].sum() + torch.median(t, 1)[0].sum() + torch.kthvalue(t, 3)[0].sum())

    expected = torch.autograd.grad(loss(x), x)[0]
    compiled = torch.compile(loss, backend="tori", options={"fallback": "error"})
    actual = torch.autograd.grad(compiled(x), x)[0]
    torch.testing.assert_close(actual, expected)


def test_segment_reduce_trains():
    # Ties share a positive gradient and each keep a negative one, as eager's kernel does.
    data = torch.tensor([5., 5., 5., -2., 5., 1., 7.], requires_grad=True)
    lengths, weight = torch.tensor([3, 0, 2, 2]), torch.tensor([3., 2., -3., 4.])

    def loss(d, l):
        return sum((torch.segment_reduce(d, how, lengths=l) * weight).sum() for how in ("max", "min", "mean", "sum"))

    expected = torch.autograd.grad(loss(data, lengths), data)[0]
    compiled = torch.compile(loss, backend="tori", options={"fallback": "error"})
    torch.testing.assert_close(torch.autograd.grad(compiled(data, lengths), data)[0], expected)
