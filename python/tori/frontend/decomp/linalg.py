"""Linear algebra that IREE has no lowering for (LAPACK's factorizations and solves),
as the classical algorithms in torch ops, unrolled over the matrix size.

The size is static (known while tracing) and small (at most `MAX_SIZE`): the graphs
grow with it. Each algorithm follows LAPACK's conventions where they show in the
outputs (getrf's first-largest pivot and 1-based int32 pivots, `info` as the first
failing column), so results match eager's within rounding. Elsewhere (symbolic sizes,
larger matrices, dtypes other than float32/float64) the entries return NotImplemented.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

MAX_SIZE = 32
_FLOATS = (torch.float32, torch.float64)


def _applies(*tensors: torch.Tensor, dtypes=_FLOATS) -> bool:
    return all(
        t.dtype in dtypes and all(isinstance(size, int) for size in t.shape)
        and all(size <= MAX_SIZE for size in t.shape[-2:])
        for t in tensors
    )


def _transpose(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1)


def _eye_like(a: torch.Tensor, n: int) -> torch.Tensor:
    return torch.eye(n, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], n, n)


def _first_failure(failed: list[torch.Tensor], batch: torch.Size, device) -> torch.Tensor:
    """LAPACK's `info`: 1 + the index of the first True in `failed` (one bool tensor
    of shape `batch` per column), 0 where none is."""
    info = torch.zeros(batch, dtype=torch.int32, device=device)
    for index in reversed(range(len(failed))):
        info = torch.where(failed[index], torch.full_like(info, index + 1), info)
    return info


# Cholesky ----------------------------------------------------------------------------


def _cholesky_lower(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L with a = L Lᵀ, reading only a's lower triangle, column by column; and info
    (the first column whose pivot is not positive, as potrf)."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    columns: list[torch.Tensor] = []
    failed = []
    for j in range(n):
        column = a[..., j:, j]
        if j:
            done = torch.stack(columns, dim=-1)  # (..., n, j)
            column = column - (done[..., j:, :] @ done[..., j, :].unsqueeze(-1)).squeeze(-1)
        pivot = column[..., 0]
        failed.append(~(pivot > 0))
        root = torch.sqrt(pivot)
        column = torch.cat([root.unsqueeze(-1), column[..., 1:] * (1 / root).unsqueeze(-1)], dim=-1)
        columns.append(torch.cat([column.new_zeros(*batch, j), column], dim=-1))
    if not n:
        return torch.zeros_like(a), torch.zeros(batch, dtype=torch.int32, device=a.device)
    return torch.stack(columns, dim=-1), _first_failure(failed, batch, a.device)


def _cholesky(a: torch.Tensor, upper: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if upper:  # U = Lᵀ of aᵀ: reads a's upper triangle
        lower, info = _cholesky_lower(_transpose(a))
        return _transpose(lower), info
    return _cholesky_lower(a)


@register_decomposition(aten.linalg_cholesky_ex.default)
def cholesky_ex(op, a, upper=False, check_errors=False):
    if check_errors or not _applies(a):
        return NotImplemented
    factor, info = _cholesky(a, upper)
    return factor.contiguous(), info


@register_decomposition(aten.cholesky.default)
def cholesky(op, a, upper=False):
    if not _applies(a):
        return NotImplemented
    factor, info = _cholesky(a, upper)
    aten._linalg_check_errors(info, "torch.cholesky", is_matrix=a.dim() == 2)
    return factor.contiguous()


# Triangular solves -------------------------------------------------------------------


def _solve_lower(a: torch.Tensor, b: torch.Tensor, unit: bool) -> torch.Tensor:
    """x with a x = b, a lower triangular (only its lower triangle is read), by forward
    substitution; batch dimensions broadcast."""
    n = a.shape[-1]
    rows: list[torch.Tensor] = []
    for i in range(n):
        row = b[..., i, :]
        if i:
            row = row - (a[..., i, :i].unsqueeze(-2) @ torch.stack(rows, dim=-2)).squeeze(-2)
        if not unit:
            row = row / a[..., i, i].unsqueeze(-1)
        rows.append(row)
    return torch.stack(rows, dim=-2)


def _solve_triangular(a, b, *, upper: bool, left: bool = True, unit: bool = False, transpose: bool = False):
    """x with op(a) x = b (left) or x op(a) = b, op(a) = aᵀ if `transpose`; broadcasts."""
    if not left:  # x a = b  <=>  aᵀ xᵀ = bᵀ
        return _transpose(_solve_triangular(a, _transpose(b), upper=upper, unit=unit, transpose=not transpose))
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, k = a.shape[-1], b.shape[-1]
    a = a.expand(*batch, n, n)
    b = b.expand(*batch, n, k)
    if n == 0 or k == 0 or 0 in batch:
        return b.new_zeros(*batch, n, k)
    if transpose:
        a, upper = _transpose(a), not upper
    if upper:  # reversing rows and columns makes an upper triangle lower
        flip = [-2, -1]
        return _solve_lower(a.flip(flip), b.flip(-2), unit).flip(-2)
    return _solve_lower(a, b, unit)


@register_decomposition(aten.linalg_solve_triangular.default)
def solve_triangular(op, a, b, *, upper, left=True, unitriangular=False):
    if not _applies(a, b) or a.dtype != b.dtype:
        return NotImplemented
    return _solve_triangular(a, b, upper=upper, left=left, unit=unitriangular).contiguous()


@register_decomposition(aten.triangular_solve.default)
def triangular_solve(op, b, a, upper=True, transpose=False, unitriangular=False):
    if not _applies(a, b) or a.dtype != b.dtype:
        return NotImplemented
    x = _solve_triangular(a, b, upper=upper, unit=unitriangular, transpose=transpose)
    batch = x.shape[:-2]
    return x.contiguous(), a.expand(*batch, *a.shape[-2:]).clone()


@register_decomposition(aten.cholesky_solve.default)
def cholesky_solve(op, b, factor, upper=False):
    """a x = b with a = L Lᵀ (or Uᵀ U)."""
    if not _applies(b, factor) or b.dtype != factor.dtype:
        return NotImplemented
    lower = _transpose(factor) if upper else factor
    y = _solve_triangular(lower, b, upper=False)
    return _solve_triangular(lower, y, upper=False, transpose=True).contiguous()


@register_decomposition(aten.cholesky_inverse.default)
def cholesky_inverse(op, factor, upper=False):
    if not _applies(factor):
        return NotImplemented
    n = factor.shape[-1]
    return cholesky_solve(None, _eye_like(factor, n), factor, upper)


# LU ----------------------------------------------------------------------------------


def _swap_rows(a: torch.Tensor, i: int, p: torch.Tensor) -> torch.Tensor:
    """a with rows i and p (a tensor of a's batch shape) exchanged."""
    rows = torch.arange(a.shape[-2], device=a.device)
    row_i = a[..., i:i + 1, :]
    row_p = a.gather(-2, p[..., None, None].expand(*a.shape[:-2], 1, a.shape[-1]))
    at_p = (rows == p.unsqueeze(-1)).unsqueeze(-1)
    return torch.where((rows == i).unsqueeze(-1), row_p, torch.where(at_p, row_i, a))


def _lu_factor(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """getrf: P a = L U with partial pivoting (the first row of largest |a| in the
    column), as (LU, 1-based int32 pivots, info = the first column whose pivot is 0)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    if a.numel() == 0:
        return a.clone(), torch.zeros(*batch, k, dtype=torch.int32, device=a.device), \
            torch.zeros(batch, dtype=torch.int32, device=a.device)
    rows = torch.arange(m, device=a.device)
    tiny = torch.finfo(a.dtype).tiny
    pivots, failed = [], []
    for j in range(k):
        column = a[..., j:, j].abs()
        first = torch.where(column == column.amax(-1, keepdim=True), rows[j:], m).amin(-1)
        p = torch.where(first == m, j, first)  # a NaN column keeps its row
        pivots.append(p)
        a = _swap_rows(a, j, p)
        pivot = a[..., j, j]
        failed.append(pivot == 0)
        if j + 1 == m:
            break
        below = a[..., j + 1:, j]
        pivot = pivot.unsqueeze(-1)
        scaled = torch.where(pivot.abs() >= tiny, below * (1 / pivot), below / pivot)
        below = torch.where(pivot == 0, below, scaled)
        trailing = a[..., j + 1:, j + 1:] - below.unsqueeze(-1) * a[..., j, j + 1:].unsqueeze(-2)
        a = torch.cat([a[..., :j + 1, :], torch.cat([a[..., j + 1:, :j], below.unsqueeze(-1), trailing], -1)], -2)
    return a, (torch.stack(pivots, -1) + 1).to(torch.int32), _first_failure(failed, batch, a.device)


def _permute_rows(b: torch.Tensor, pivots: torch.Tensor, inverse: bool) -> torch.Tensor:
    """Pᵀ b (getrs's row interchanges, in order), or P b with `inverse`."""
    k = pivots.shape[-1]
    order = reversed(range(k)) if inverse else range(k)
    for i in order:
        b = _swap_rows(b, i, pivots[..., i].to(torch.int64) - 1)
    return b


def _lu_solve(lu, pivots, b, *, left: bool = True, adjoint: bool = False) -> torch.Tensor:
    """x with a x = b (aᵀ x = b with `adjoint`; x a = b unless `left`), a = P L U."""
    if not left:  # x a = b  <=>  aᵀ xᵀ = bᵀ
        return _transpose(_lu_solve(lu, pivots, _transpose(b), adjoint=not adjoint))
    batch = torch.broadcast_shapes(lu.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    n, k = lu.shape[-1], b.shape[-1]
    lu, b = lu.expand(*batch, n, n), b.expand(*batch, n, k)
    pivots = pivots.expand(*batch, n)
    if n == 0 or k == 0 or 0 in batch:
        return b.new_zeros(*batch, n, k)
    if adjoint:  # Uᵀ Lᵀ Pᵀ x = b
        y = _solve_triangular(lu, b, upper=True, transpose=True)
        y = _solve_triangular(lu, y, upper=False, unit=True, transpose=True)
        return _permute_rows(y, pivots, inverse=True)
    y = _solve_triangular(lu, _permute_rows(b, pivots, inverse=False), upper=False, unit=True)
    return _solve_triangular(lu, y, upper=True)


def _lu_unpack(lu, pivots, unpack_data: bool = True, unpack_pivots: bool = True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    empty = lu.new_empty(0)
    lower = upper = permutation = empty
    if unpack_data:
        lower = torch.tril(lu[..., :, :k], -1) + torch.eye(m, k, dtype=lu.dtype, device=lu.device)
        upper = torch.triu(lu[..., :k, :])
    if unpack_pivots:
        batch = pivots.shape[:-1]
        rows = torch.arange(m, device=lu.device)
        order = rows.expand(*batch, m)
        if order.numel():
            order = _permute_rows(order.unsqueeze(-1), pivots, inverse=False).squeeze(-1)
        permutation = (rows.unsqueeze(-1) == order.unsqueeze(-2)).to(lu.dtype)
    return permutation, lower, upper


@register_decomposition(aten.linalg_lu_factor_ex.default)
def lu_factor_ex(op, a, pivot=True, check_errors=False):
    if not pivot or check_errors or not _applies(a):
        return NotImplemented
    return _lu_factor(a)


@register_decomposition(aten.linalg_lu.default)
def lu(op, a, pivot=True):
    if not pivot or not _applies(a):
        return NotImplemented
    factor, pivots, _ = _lu_factor(a)
    return _lu_unpack(factor, pivots)


@register_decomposition(aten.lu_unpack.default)
def lu_unpack(op, lu, pivots, unpack_data=True, unpack_pivots=True):
    if not _applies(lu) or pivots.dtype != torch.int32:
        return NotImplemented
    return _lu_unpack(lu, pivots, unpack_data, unpack_pivots)


@register_decomposition(aten.linalg_lu_solve.default)
def lu_solve(op, lu, pivots, b, *, left=True, adjoint=False):
    if not _applies(lu, b) or lu.dtype != b.dtype:
        return NotImplemented
    return _lu_solve(lu, pivots, b, left=left, adjoint=adjoint).contiguous()


def _solve(a, b, left: bool):
    """linalg.solve: a = P L U, then two triangular solves."""
    vector = b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])
    if vector:
        b = b.unsqueeze(-1)
    factor, pivots, info = _lu_factor(a)
    x = _lu_solve(factor, pivots, b, left=left)
    return (x.squeeze(-1) if vector else x), factor, pivots, info


@register_decomposition(aten._linalg_solve_ex.default)
def solve_ex(op, a, b, *, left=True, check_errors=False):
    if check_errors or not _applies(a, b) or a.dtype != b.dtype:
        return NotImplemented
    x, factor, pivots, info = _solve(a, b, left)
    return x.contiguous(), factor.contiguous(), pivots, info


@register_decomposition(aten.linalg_inv_ex.default)
def inv_ex(op, a, check_errors=False):
    if check_errors or not _applies(a):
        return NotImplemented
    x, _, _, info = _solve(a, _eye_like(a, a.shape[-1]), True)
    return x.contiguous(), info


def _pivots_sign(pivots: torch.Tensor, dtype) -> torch.Tensor:
    """The determinant of P: -1 to the number of rows that pivoting exchanged."""
    steps = torch.arange(1, pivots.shape[-1] + 1, dtype=torch.int32, device=pivots.device)
    odd = (pivots != steps).to(torch.int64).sum(-1) % 2
    return (1 - 2 * odd).to(dtype)


def _det_factors(a):
    # ATen factors aᵀ when a is contiguous (det aᵀ = det a).
    return _lu_factor(_transpose(a) if a.is_contiguous() else a)


@register_decomposition(aten._linalg_det.default)
def det(op, a):
    if not _applies(a):
        return NotImplemented
    factor, pivots, _ = _det_factors(a)
    value = _pivots_sign(pivots, a.dtype) * torch.diagonal(factor, 0, -2, -1).prod(-1)
    return value, factor.contiguous(), pivots


@register_decomposition(aten._linalg_slogdet.default)
def slogdet(op, a):
    if not _applies(a):
        return NotImplemented
    factor, pivots, _ = _det_factors(a)
    diagonal = torch.diagonal(factor, 0, -2, -1)
    sign = torch.sign(diagonal).prod(-1) * _pivots_sign(pivots, a.dtype)
    return sign, diagonal.abs().log().sum(-1), factor.contiguous(), pivots
