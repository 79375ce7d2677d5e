"""QR factorization and the matrix exponential, which IREE has no lowering for, as
Householder reflections and scaled Taylor series in torch ops, unrolled over columns.

geqrf follows LAPACK's conventions (dlarfg's reflectors, R's signs, tau = 0 for a
column already zero below the diagonal), so Q and R equal eager's within rounding. Each
step works on the whole (batched) matrix with masks, not on slices, so the graph grows
by a few ops per column. Beyond `MAX_SIZE` or for symbolic sizes the entries return
NotImplemented, as in `linalg`.
"""

from __future__ import annotations

import math

import torch

from tori.frontend.decomp.linalg import MAX_SIZE, _applies
from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


def _reflector_column(a: torch.Tensor, i: int, below: torch.Tensor) -> torch.Tensor:
    """v of the i-th reflector stored in a's column i: 1 at row i, a's entries below,
    0 above (`below` is a's row index > i)."""
    rows = below.shape[0]
    unit = (torch.arange(rows, device=a.device) == i).to(a.dtype)
    return torch.where(below, a[..., :, i], unit)


def _householder_product(a: torch.Tensor, tau: torch.Tensor, columns: int) -> torch.Tensor:
    """The first `columns` columns of H_0 H_1 … H_{k-1}, H_i = I - tau_i v_i v_iᵀ with
    v_i stored in a's column i (orgqr): applied to the identity's columns, last first."""
    m = a.shape[-2]
    batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    q = torch.eye(m, columns, dtype=a.dtype, device=a.device).expand(*batch, m, columns)
    rows = torch.arange(m, device=a.device)
    for i in reversed(range(tau.shape[-1])):
        v = _reflector_column(a, i, rows > i)
        w = (v.unsqueeze(-2) @ q).squeeze(-2)  # vᵀ Q
        q = q - (tau[..., i, None] * v).unsqueeze(-1) * w.unsqueeze(-2)
    return q


def _geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_geqrf_batch`, on two copies of a single matrix: on one, iree-compile put the
    chains of one-element ops per column (alpha, the norm, tau) into one scalar dispatch
    and ran past 10 minutes on a 3×3 matrix (see `gamma._off_scalar_dispatch`)."""
    batch = a.shape[:-2]
    if math.prod(batch) != 1:
        return _geqrf_batch(a)
    factors, tau = _geqrf_batch(a.reshape(1, *a.shape[-2:]).expand(2, *a.shape[-2:]))
    return factors[0].reshape(*batch, *factors.shape[-2:]), tau[0].reshape(*batch, tau.shape[-1])


def _geqrf_batch(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LAPACK's unblocked Householder QR (geqr2): column j's reflector from dlarfg
    (beta = -sign(alpha)·‖(alpha, x)‖, tau = (beta - alpha)/beta, v = x/(alpha - beta),
    tau = 0 where x is already 0), stored below the diagonal, beta on it; then the
    columns right of j are reflected."""
    m, n = a.shape[-2:]
    rows = torch.arange(m, device=a.device)
    cols = torch.arange(n, device=a.device)
    taus = []
    for j in range(min(m, n)):
        below = rows > j
        column = a[..., :, j]
        alpha = column[..., j]
        x = torch.where(below, column, 0)
        x_norm = torch.linalg.vector_norm(x, dim=-1)
        keep = x_norm == 0
        beta = torch.where(alpha >= 0, -1.0, 1.0).to(a.dtype) * torch.hypot(alpha, x_norm)
        tau = torch.where(keep, 0, (beta - alpha) / beta)
        scale = torch.where(keep, 1, 1 / (alpha - beta))
        v = torch.where(below, column * scale.unsqueeze(-1), (rows == j).to(a.dtype))
        w = (v.unsqueeze(-2) @ a).squeeze(-2)  # vᵀ A
        reflected = a - (tau.unsqueeze(-1) * v).unsqueeze(-1) * w.unsqueeze(-2)
        new_column = torch.where(below, v, torch.where(rows == j, torch.where(keep, alpha, beta).unsqueeze(-1), column))
        a = torch.where(cols > j, reflected, torch.where(cols == j, new_column.unsqueeze(-1), a))
        taus.append(tau)
    if not taus:
        return a.clone(), a.new_zeros(*a.shape[:-2], 0)
    return a, torch.stack(taus, dim=-1)


@register_decomposition(aten.geqrf.default)
def geqrf(op, a):
    if not _applies(a):
        return NotImplemented
    if a.numel() == 0:
        return a.clone(), a.new_zeros(*a.shape[:-2], min(a.shape[-2:]))
    factors, tau = _geqrf(a)
    return factors.contiguous(), tau


@register_decomposition(aten.linalg_householder_product.default)
def householder_product(op, a, tau):
    if not _applies(a, tau) or a.dtype != tau.dtype:
        return NotImplemented
    m, n = a.shape[-2:]
    if not m >= n >= tau.shape[-1]:
        return NotImplemented  # eager raises
    if a.numel() == 0 or tau.numel() == 0:
        batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
        return torch.eye(m, n, dtype=a.dtype, device=a.device).expand(*batch, m, n).clone()
    return _householder_product(a, tau, n).contiguous()


@register_decomposition(aten.ormqr.default)
def ormqr(op, a, tau, other, left=True, transpose=False):
    """Q (or Q^T) times `other`, or `other` times it, where Q is the full m x m product
    of geqrf's first k reflectors in `a`: those reflectors padded with tau = 0 (an
    identity reflection) to m columns, multiplied out by householder_product."""
    if not _applies(a, tau, other) or not (a.dtype == tau.dtype == other.dtype):
        return NotImplemented
    m, k = a.shape[-2], tau.shape[-1]
    if k > min(m, a.shape[-1]):
        return NotImplemented  # eager raises
    reflectors = a[..., :, :k]
    if k < m:
        reflectors = torch.cat([reflectors, reflectors.new_zeros(*reflectors.shape[:-1], m - k)], -1)
        tau = torch.cat([tau, tau.new_zeros(*tau.shape[:-1], m - k)], -1)
    q = aten.linalg_householder_product.default(reflectors, tau)
    if transpose:
        q = q.mT
    return q @ other if left else other @ q


@register_decomposition(aten.linalg_qr.default)
def linalg_qr(op, a, mode="reduced"):
    """Q from geqrf's reflectors (orgqr), R the upper triangle: Q m×k and R k×n
    ('reduced'), Q m×m and R m×n ('complete'), or R alone and an empty Q ('r')."""
    if not _applies(a) or mode not in ("reduced", "complete", "r"):
        return NotImplemented
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    k = min(m, n)
    q_columns = m if mode == "complete" else k
    r_rows = m if mode == "complete" else k
    if a.numel() == 0:
        q = torch.eye(m, q_columns, dtype=a.dtype, device=a.device).expand(*batch, m, q_columns).clone()
        r = a.new_zeros(*batch, r_rows, n)
    else:
        factors, tau = _geqrf(a)
        r = torch.triu(factors[..., :r_rows, :])
        q = _householder_product(factors, tau, q_columns)
    if mode == "r":
        q = a.new_zeros(0)
    return q.contiguous(), r.contiguous()


# Matrix exponential ------------------------------------------------------------------

_TAYLOR_DEGREE = 16
_SCALED_NORM = 1.0  # ‖A/2^s‖₁ ≤ 1: the series' remainder is below 1/17! ≈ 3e-15
_MAX_SQUARINGS = 32  # norms up to 2^32


def _matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """exp(A) = exp(A/2^s)^(2^s), s the smallest with ‖A/2^s‖₁ ≤ 1 (per matrix, at most
    `_MAX_SQUARINGS`), exp of the scaled matrix by its Taylor series in Horner form; the
    squarings run as a fixed number of steps, each kept where it is one of s."""
    n = a.shape[-1]
    # In float32: IREE's CPU backend has no float64 log2 (power-of-two scales are exact in either).
    norm = a.abs().sum(-2).amax(-1).to(torch.float32)
    s = torch.clamp(torch.ceil(torch.log2(norm / _SCALED_NORM)), 0, _MAX_SQUARINGS)
    s = torch.where(torch.isnan(s), 0, s)
    scaled = a * torch.exp2(-s).to(a.dtype)[..., None, None]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    result = eye + scaled / _TAYLOR_DEGREE
    for k in reversed(range(1, _TAYLOR_DEGREE)):
        result = eye + (scaled @ result) / k
    for step in range(_MAX_SQUARINGS):
        result = torch.where((step < s)[..., None, None], result @ result, result)
    return result


@register_decomposition(aten.linalg_matrix_exp.default)
def matrix_exp(op, a):
    """In float64 for float32 and 16-bit floats: the squarings multiply the series'
    rounding error by up to 2^s."""
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or \
            not all(isinstance(size, int) and size <= MAX_SIZE for size in a.shape[-2:]):
        return NotImplemented
    if a.numel() == 0:
        return a.clone()
    return _matrix_exp(a.to(torch.float64)).to(a.dtype)
