"""Reductions, scans and normalizations on degenerate shapes: a 0-d tensor, an empty
one, one element along the reduced dim. Each shape compiles every op into one graph
(fallback='error') and each result must equal eager's. Before tori handled them,
softmax of a 0-d value made iree-compile retry a lowering without end, var and std of
one crashed it, and argmax along a dim of size 1 read out of bounds at run time."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tori.testing import count_graphs

OPS = {
    "softmax": lambda x, d: torch.softmax(x, d),
    "log_softmax": lambda x, d: torch.log_softmax(x, d),
    "sum": lambda x, d: x.sum(d),
    "mean": lambda x, d: x.mean(d),
    "mean_all": lambda x, d: x.mean(),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d, keepdim=True),
    "max_dim": lambda x, d: x.max(d),
    "min_dim": lambda x, d: x.min(d, keepdim=True),
    "argmax": lambda x, d: x.argmax(d),
    "argmin_keepdim": lambda x, d: x.argmin(d, keepdim=True),
    "argmax_all": lambda x, d: x.argmax(),
    "prod": lambda x, d: x.prod(d),
    "var": lambda x, d: x.var(d),
    "std": lambda x, d: x.std(d, correction=0),
    "var_mean": lambda x, d: torch.var_mean(x, d),
    "logsumexp": lambda x, d: torch.logsumexp(x, d),
    "norm": lambda x, d: torch.linalg.vector_norm(x, dim=d),
    "all": lambda x, d: (x > 0).all(d),
    "any": lambda x, d: (x > 0).any(d),
    "cumsum": lambda x, d: x.cumsum(d),
    "cumprod": lambda x, d: x.cumprod(d),
    "cummax": lambda x, d: x.cummax(d),
    "logcumsumexp": lambda x, d: torch.logcumsumexp(x, d),
    "sort": lambda x, d: x.sort(d),
    "topk": lambda x, d: x.topk(1 if x.dim() == 0 or x.shape[d] else 0, d),
    "softmax_of_mean": lambda x, d: torch.softmax(x.mean(), -1),
    "layer_norm": lambda x, d: F.layer_norm(x, x.shape[-1:]) if x.dim() else x,
}

# name: (shape, dim); the reduced dim is 0-d's only "dim", or of size 0 or 1.
SHAPES = {"0-d": ((), -1), "one element": ((1,), 0), "size 1 along dim": ((3, 1), 1),
          "all ones": ((1, 1), -1), "empty along dim": ((3, 0), 1), "empty elsewhere": ((0, 4), 1)}


def _valid(op, x, d) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(x, d)
        return True
    except (RuntimeError, IndexError):  # eager refuses it (argmax of an empty dim)
        return False


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_reductions_on_degenerate_shapes_match_eager(shape_name):
    shape, d = SHAPES[shape_name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    names = [name for name, op in OPS.items() if _valid(op, x, d)]
    assert len(names) >= 20, names  # eager refuses only the empty extrema

    def program(t):
        t = t * 1.5  # a computed value, not the input itself
        return tuple(OPS[name](t, d) for name in names)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var's "degrees of freedom is <= 0"
        expected = program(x)
        torch._dynamo.reset()
        with count_graphs() as count:
            actual = torch.compile(program, backend="tori", fullgraph=True, dynamic=False,
                                   options={"fallback": "error", "compile_timeout_s": 120})(x)
    assert count.compiled_calls == 1 and count.fallback_calls == 0
    for name, a, e in zip(names, actual, expected):
        torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m, name=name: f"{name} on {shape_name}: {m}")


def test_the_training_step_whose_compile_never_ended_compiles_and_its_gradients_match():
    # mean to a 0-d value, cumsum, a clamp written as two wheres, softmax of the 0-d
    # value: iree-compile ran until a 900 s timeout on its forward graph.
    def step(x):
        m = x.mean()
        c = torch.cumsum(m, -1)
        c = torch.where(c < -0.5, torch.tensor(-0.5), c)
        c = torch.where(c > 0.5, torch.tensor(0.5), c)
        return torch.softmax(c, -1) + c, c

    x = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    expected = step(x)
    (grad_expected,) = torch.autograd.grad(expected[0] * 2.0 + expected[1] * 3.0, x)
    torch._dynamo.reset()
    with count_graphs() as count:
        actual = torch.compile(step, backend="tori", options={"fallback": "error", "compile_timeout_s": 120})(x)
        (grad_actual,) = torch.autograd.grad(actual[0] * 2.0 + actual[1] * 3.0, x)
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0  # forward and backward
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(grad_actual, grad_expected)


def test_moments_of_no_element_are_nan_with_dynamic_shapes_too():
    # From `make fuzz` (dynamic, seed 3): var of a [s0, 0] tensor was -0.0 (eager NaN).
    fn = lambda x: (torch.var(x), x.std(1, keepdim=True), torch.var_mean(x, 1), x.var(0), torch.std_mean(x))  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", dynamic=True, options={"fallback": "error"})
    for shape in [(2, 0), (7, 0)]:
        x = torch.zeros(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual, expected = compiled(x), fn(x)
        for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
            torch.testing.assert_close(a, e, equal_nan=True)
