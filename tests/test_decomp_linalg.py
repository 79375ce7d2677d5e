"""Linear algebra written in torch ops (tori.frontend.decomp.linalg), compiled and
compared with eager's LAPACK; the error checks of torch.linalg run in IREE."""

import pytest
import torch

from tori.errors import ToriRuntimeError
from tori.testing import assert_matches_eager


def _positive_definite(*shape):
    a = torch.randn(*shape)
    return a @ a.transpose(-2, -1) + shape[-1] * torch.eye(shape[-1])


def test_cholesky_family():
    torch.manual_seed(0)
    a = _positive_definite(2, 3, 3)
    b = torch.randn(2, 3, 2)

    def fn(a, b):
        lower, info = torch.linalg.cholesky_ex(a)
        upper = torch.linalg.cholesky(a, upper=True)
        return (lower, info, upper, torch.cholesky_solve(b, lower), torch.cholesky_solve(b, upper, upper=True),
                torch.cholesky_inverse(lower[1]))

    assert_matches_eager(fn, a, b)


def test_cholesky_info_of_a_matrix_that_is_not_positive_definite():
    a = torch.stack([_positive_definite(4, 4), torch.diag(torch.tensor([1.0, 2.0, -1.0, 3.0]))])
    info = assert_matches_eager(lambda a: torch.linalg.cholesky_ex(a)[1], a)
    assert info.tolist() == [0, 3]


def test_linalg_error_check_fails_the_call_where_eager_raises():
    compiled = torch.compile(torch.linalg.cholesky, backend="tori", options={"fallback": "error"})
    torch._dynamo.reset()
    assert torch.allclose(compiled(torch.eye(3) * 4), torch.eye(3) * 2)
    with pytest.raises(ToriRuntimeError, match="linalg.cholesky"):
        compiled(-torch.eye(3))


def test_cholesky_trains():
    a = _positive_definite(4, 4).requires_grad_()
    compiled = torch.compile(lambda a: torch.linalg.cholesky(a).sum(), backend="tori", options={"fallback": "error"})
    torch._dynamo.reset()
    compiled(a).backward()
    expected = torch.autograd.grad(torch.linalg.cholesky(a).sum(), a)[0]
    torch.testing.assert_close(a.grad, expected, rtol=1e-4, atol=1e-5)


def test_triangular_solves():
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4) + 4 * torch.eye(4)
    b = torch.randn(2, 4, 3)
    c = torch.randn(3, 4)

    def fn(a, b, c):
        return (torch.linalg.solve_triangular(a, b, upper=True),
                torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
                torch.linalg.solve_triangular(a[0], c, upper=False, left=False),
                torch.triangular_solve(b, a, upper=False, transpose=True),
                torch.triangular_solve(b[0], a))

    assert_matches_eager(fn, a, b, c, rtol=1e-5, atol=1e-5)


def test_lu_family():
    torch.manual_seed(0)
    a = torch.randn(2, 2, 2)
    b = torch.randn(2, 2, 3)

    def fn(a, b):
        lu, pivots, info = torch.linalg.lu_factor_ex(a)
        return (lu, pivots, info, torch.lu_unpack(lu, pivots), torch.linalg.lu_solve(lu, pivots, b),
                torch.linalg.lu_solve(lu, pivots, b, adjoint=True), torch.linalg.lu_solve(lu, pivots, b.mT, left=False))

    assert_matches_eager(fn, a, b, rtol=1e-5, atol=1e-5)


def test_lu_of_singular_matrices_pivots_and_info_like_lapack():
    # A zero column (pivot 0: no exchange, info names it) and a tie between rows.
    a = torch.tensor([[[0.0, 1.0, 2.0], [0.0, 3.0, 1.0], [0.0, -3.0, 5.0]],
                      [[1.0, 2.0, 3.0], [-1.0, 2.0, 1.0], [2.0, 4.0, 6.0]]])
    _, pivots, info = assert_matches_eager(torch.linalg.lu_factor_ex, a)
    assert info.tolist() == [1, 3]


def test_inverse_solve_and_determinants():
    torch.manual_seed(0)
    a = torch.randn(2, 2, 2)
    # Elimination is exact here: the zero pivot is exactly zero, as in LAPACK.
    singular = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [4.0, 5.0, 6.0]])

    def fn(a, singular):
        return (torch.linalg.inv(a), torch.linalg.solve(a, a[:, 0]), torch.linalg.solve(a[0], a, left=False),
                torch.linalg.det(a), torch.linalg.slogdet(a),
                torch.linalg.det(singular), torch.linalg.slogdet(singular), torch.linalg.inv_ex(singular)[1])

    assert_matches_eager(fn, a, singular, rtol=1e-5, atol=1e-5)


def test_inverse_of_a_singular_matrix_fails_the_call():
    compiled = torch.compile(torch.linalg.inv, backend="tori", options={"fallback": "error"})
    torch._dynamo.reset()
    with pytest.raises(ToriRuntimeError, match="linalg.inv"):
        compiled(torch.zeros(2, 2))
