"""QR (geqrf, householder_product, linalg.qr), the matrix exponential and histogramdd
written in torch ops (tori.frontend.decomp.qr, .histogram), compiled and compared with
eager's LAPACK results."""

import torch

from tori.testing import assert_matches_eager, count_graphs


def test_qr_family_matches_lapack():
    torch.manual_seed(0)
    tall = torch.randn(6, 5)
    tau = torch.randn(5)
    batched = torch.randn(2, 1, 5, 5)
    deficient = torch.randn(5, 4)
    deficient[:, 1] = 0  # already zero below the diagonal: tau = 0, as LAPACK leaves it
    empty = torch.randn(5, 0)

    def fn(tall, tau, batched, deficient, empty):
        factors = torch.geqrf(deficient)
        return (factors, torch.linalg.householder_product(*factors), torch.linalg.householder_product(tall, tau),
                torch.linalg.qr(tall), torch.qr(batched[..., :3], some=False), torch.linalg.qr(tall[:3], mode="r"),
                torch.linalg.qr(empty))

    ((_, tau_deficient), q_deficient, _, (q, r), (q_complete, r_complete), *_) = assert_matches_eager(
        fn, tall, tau, batched, deficient, empty, rtol=1e-5, atol=1e-5)
    assert tau_deficient[1] == 0
    for orthogonal in (q, q_deficient):
        torch.testing.assert_close(orthogonal.mT @ orthogonal, torch.eye(orthogonal.shape[-1]), rtol=0, atol=1e-5)
    torch.testing.assert_close(q_complete.mT @ q_complete, torch.eye(5).expand(2, 1, 5, 5), rtol=0, atol=1e-5)
    assert torch.equal(r, torch.triu(r)) and torch.equal(r_complete, torch.triu(r_complete))
    assert r_complete.shape == (2, 1, 5, 3)
    torch.testing.assert_close(q @ r, tall, rtol=0, atol=1e-5)


def test_matrix_exp_of_small_and_large_norms():
    # Eager's float32 result is itself off by up to 2e-3 relative in entries that cancel
    # (its squarings round in float32): compared here with eager's float64 result.
    torch.manual_seed(0)
    a = torch.randn(4, 5, 5) * torch.tensor([0.01, 1.0, 4.0, 8.0]).reshape(4, 1, 1)
    rotation = torch.tensor([[0.0, -30.0], [30.0, 0.0]])  # norm 30, exp a rotation by 30 rad
    compiled = torch.compile(lambda a, b: (torch.linalg.matrix_exp(a), torch.linalg.matrix_exp(b)),
                             backend="tori", options={"fallback": "error"})
    torch._dynamo.reset()
    with count_graphs() as count:
        exp_a, exp_rotation = compiled(a, rotation)
    assert count.compiled_graphs == 1 and count.compiled_calls == 1 and count.fallback_graphs == 0
    assert torch.linalg.matrix_norm(a[3], 1) > 20
    torch.testing.assert_close(exp_a, torch.linalg.matrix_exp(a.double()).float(), rtol=1e-5, atol=1e-6)
    angle = torch.tensor(30.0, dtype=torch.float64)
    expected = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.stack([angle.sin(), angle.cos()])])
    torch.testing.assert_close(exp_rotation, expected.float(), rtol=0, atol=1e-5)


def test_histogramdd_counts_weights_and_densities():
    torch.manual_seed(0)
    points = torch.randn(20, 3)
    weight = torch.rand(20)
    edges = [torch.tensor([-1.0, 0.5]), torch.tensor([-2.0, 0.0, 1.0, 3.0]), torch.tensor([-0.5, 0.0, 0.5])]

    def fn(points, weight, x, y, z):
        return (torch.histogramdd(points, [1, 1, 1]), torch.histogramdd(points, [2, 3, 4], weight=weight, density=True),
                torch.histogramdd(points, (2, 2, 2), range=[-1.0, 1.0, 0.0, 2.0, -3.0, 0.0]),
                torch.histogramdd(points, [x, y, z], weight=weight), torch.histogramdd(points, [x, y, z], density=True))

    counts = assert_matches_eager(fn, points, weight, *edges, rtol=1e-5, atol=1e-5)[0].hist
    assert counts.item() == 20


def test_ormqr_applies_the_reflectors_from_either_side():
    # ormqr multiplies by the full m x m Q of geqrf's first k reflectors.
    torch.manual_seed(0)
    a, tau = torch.geqrf(torch.randn(6, 4))
    square = torch.randn(6, 6)

    def fn(a, tau, square):
        return (torch.ormqr(a, tau, square), torch.ormqr(a, tau, square, transpose=True),
                torch.ormqr(a, tau, square[:, :2]), torch.ormqr(a, tau, square, left=False, transpose=True))

    assert_matches_eager(fn, a, tau, square, rtol=1e-5, atol=1e-5)
