"""Symmetric eigenvalues and singular values by Jacobi rotations
(tori.frontend.decomp.spectral), compiled and compared with eager's LAPACK. Each
decomposed op is a few hundred traced ops: the tests keep to a few per graph."""

import pytest
import torch

from tori.errors import CompileError
from tori.testing import assert_matches_eager


def test_singular_values_condition_numbers_and_pseudo_inverses():
    torch.manual_seed(0)
    # Random, and graded to a condition number near 1e4.
    a = torch.stack([torch.randn(4, 4) * 9, torch.randn(4, 4) * torch.logspace(0, -4, 4) * 9])
    # Random, and exactly rank 2 (a repeated column).
    tall = torch.randn(2, 5, 3) * 9
    tall[1, :, 2] = tall[1, :, 0]

    def fn(a, tall):
        u, s, vh = torch.linalg.svd(tall, full_matrices=True)
        return (torch.linalg.svdvals(a), torch.linalg.cond(a), torch.linalg.pinv(a),
                torch.linalg.pinv(a, atol=a.abs().amax((-2, -1))),  # a tolerance per matrix
                torch.linalg.matrix_rank(tall), torch.linalg.pinv(tall, rtol=1e-4),
                # singular vectors are unique up to sign: check what defines them
                s, u[..., :3] @ torch.diag_embed(s) @ vh, u.mT @ u, vh @ vh.mT)

    actual = assert_matches_eager(fn, a, tall, rtol=1e-3, atol=1e-4)
    assert actual[4].tolist() == [3, 2]


def test_symmetric_eigenvalues_vectors_and_hermitian_pseudo_inverse():
    torch.manual_seed(0)
    a = torch.randn(4, 4) * 9
    q, _ = torch.linalg.qr(torch.randn(4, 4))
    clustered = q @ torch.diag(torch.tensor([1.0, 1.001, 2.0, -2.0])) @ q.mT
    low_rank = torch.randn(4, 2) * 9
    symmetric = torch.stack([a + a.mT, clustered, low_rank @ low_rank.mT])

    def fn(symmetric, a):
        values, vectors = torch.linalg.eigh(symmetric)
        return (values, vectors @ torch.diag_embed(values) @ vectors.mT, vectors.mT @ vectors,
                torch.linalg.matrix_rank(symmetric, hermitian=True),
                torch.linalg.pinv(symmetric, hermitian=True, rtol=1e-4), torch.linalg.eigvalsh(a[:3, :3], UPLO="U"))

    actual = assert_matches_eager(fn, symmetric, a, rtol=1e-3, atol=1e-4)
    assert actual[3].tolist() == [4, 4, 2]


def test_empty_matrices():
    def fn(empty, no_columns, empty_batch):
        return (torch.linalg.svd(empty), torch.linalg.svd(no_columns), torch.linalg.svd(no_columns.mT),
                torch.linalg.svdvals(empty_batch), torch.linalg.eigvalsh(empty_batch), torch.linalg.eigh(empty),
                torch.linalg.pinv(no_columns), torch.linalg.matrix_rank(empty_batch))

    assert_matches_eager(fn, torch.zeros(0, 0), torch.zeros(2, 3, 0), torch.zeros(0, 5, 5))


def test_larger_matrices_are_left_to_lapack():
    compiled = torch.compile(torch.linalg.svdvals, backend="tori", options={"fallback": "error"})
    torch._dynamo.reset()
    with pytest.raises(CompileError, match="_linalg_svd"):
        compiled(torch.randn(9, 9))
