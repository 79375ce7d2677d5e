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
