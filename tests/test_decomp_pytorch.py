"""Ops that IREE does not lower, compiled through a decomposition: PyTorch's own
(`decomp/pytorch.py`) or tori's formulas; each test compares with eager."""

import math

import pytest
import torch

from tori.testing import assert_matches_eager


def test_pytorch_decompositions_of_reductions_and_copies():
    def fn(bias, mat, vec, x, b):
        return (torch.addmv(bias, mat, vec, beta=0.5, alpha=2.0), x.all(dim=1), x.any(dim=0), x.cumprod(1),
                x.narrow_copy(1, 1, 2), b.all(dim=-1), b.any(dim=-1))

    x = torch.tensor([[1.0, 0.0, 2.0], [math.nan, -1.5, 3.0]])
    assert_matches_eager(fn, torch.randn(4), torch.randn(4, 3), torch.randn(3), x, torch.rand(3, 4) > 0.3)


def test_batch_norm_with_running_stats_update():
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    weight, bias = torch.randn(3), torch.randn(3)

    def fn(x, mean, var):
        out = torch.ops.aten._batch_norm_with_update_functional(x, weight, bias, mean, var, 0.1, 1e-5)
        return out[0], out[4], out[5]

    assert_matches_eager(fn, x, mean, var)
