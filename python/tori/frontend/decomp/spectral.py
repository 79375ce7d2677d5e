"""Symmetric eigenvalues and singular values of small matrices (LAPACK's syevd and
gesdd, which IREE has no lowering for) by Jacobi rotations, in torch ops.

Both use the parallel ("round-robin") cyclic ordering: a sweep is n - 1 rounds (n
rounded up to even with a zero column) of n/2 disjoint plane rotations, and a round is
applied at once as elementwise ops on whole matrices, the pairs being the two halves of
the columns (and rows), which a fixed move of slices reorders between rounds: the traced
graph grows with rounds, not with rotations, and needs no index tensors. Eigenvalues:
two-sided Jacobi on the symmetric matrix. Singular values: one-sided (Hestenes) Jacobi,
orthogonalizing the columns of the matrix (of its transpose when it is wide); each
round's rotations come from freshly computed column norms and dot products, which keeps
small singular values accurate to their own size.

The number of sweeps is fixed (`SWEEPS`): Jacobi converges quadratically, and 5 sweeps
already left float32 matrices of order up to `MAX_ORDER` = 8 at rounding level (random,
symmetric, graded to condition 1e4, and rank-deficient ones, 1000 each; 4 sweeps were
off by 1e-4 at order 8); 6 leave a margin. Larger orders, symbolic sizes and dtypes other than float32/float64 return
NotImplemented. Eigenvectors and singular vectors are unique only up to sign, and ours
need not have LAPACK's signs; pinv, ranks, norms and condition numbers do not depend on
them. An op's graph has SWEEPS · (n - 1) rounds; iree-compile takes seconds for n = 5.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten

MAX_ORDER = 8
MAX_SIZE = 32  # of the other dimension: singular vectors are completed column by column
SWEEPS = 6
_FLOATS = (torch.float32, torch.float64)


def _applies(a: torch.Tensor) -> bool:
    return (a.dtype in _FLOATS and all(isinstance(size, int) for size in a.shape)
            and min(a.shape[-2:]) <= MAX_ORDER and max(a.shape[-2:]) <= MAX_SIZE)


def _halves_swapped(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t with its two halves along `dim` exchanged: slot k meets its partner h + k."""
    h = t.shape[dim] // 2
    return torch.cat([t.narrow(dim, h, h), t.narrow(dim, 0, h)], dim)


def _next_round(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The round-robin's move between rounds, along `dim` (slots 0..h-1 on top, h..2h-1
    below, pairs k, h + k): slot 0 stays, the others advance one place around the ring
    1 → 2 → … → h-1 → 2h-1 → … → h → 1; after 2h - 1 rounds every two slots have met
    and all are back in place."""
    h = t.shape[dim] // 2
    if h < 2:
        return t
    pieces = [(0, 1), (h, h + 1), (1, h - 1), (h + 1, 2 * h), (h - 1, h)]
    return torch.cat([t.narrow(dim, start, stop - start) for start, stop in pieces if stop > start], dim)


def _rotation(alpha, beta, gamma):
    """c and τ per slot of the rotations [[c, s], [-s, c]] (top slot first) that zero the
    off-diagonal γ of [[α, γ], [γ, β]] for each pair, by the smaller angle; the new
    slot i is c_i x_i + τ_i x_partner(i)."""
    delta = beta - alpha
    sign = torch.where(delta < 0, -1.0, 1.0).to(delta.dtype)
    denominator = delta.abs() + torch.sqrt(delta * delta + 4 * gamma * gamma)
    safe = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
    t = torch.where(denominator == 0, torch.zeros_like(gamma), 2 * gamma * sign / safe)
    c = torch.rsqrt(1 + t * t)
    s = t * c
    return torch.cat([c, c], -1), torch.cat([-s, s], -1)


def _padded(a: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """a with a zero slice appended along each of `dims` when its size there is odd: the
    zero column never rotates (its γ is 0) and is dropped at the end."""
    for dim in dims:
        if a.shape[dim] % 2:
            shape = list(a.shape)
            shape[dim] = 1
            a = torch.cat([a, a.new_zeros(shape)], dim)
    return a


_SHARED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _shared(function):
    """`function(a, *flags)` computed once per traced tensor `a`: svdvals, cond, rank
    and pinv of one matrix in one graph share its rotations (each is hundreds of ops)."""

    def compute(a: torch.Tensor, *flags):
        results = _SHARED.setdefault(a, {})
        key = (function.__name__, flags, a._version)
        if key not in results:
            results[key] = function(a, *flags)
        return results[key]

    return compute


def _max_abs(a: torch.Tensor) -> torch.Tensor:
    """The largest |entry| per matrix (1 for a zero matrix), to keep squares in range."""
    scale = a.abs().amax((-2, -1), keepdim=True)
    return torch.where(scale == 0, torch.ones_like(scale), scale)


@_shared
def _symmetric_eigen(a: torch.Tensor, lower: bool):
    """Eigenvalues (ascending) and eigenvectors of the symmetric matrix held in a's
    lower (or upper) triangle (unused eigenvectors are dropped from the graph)."""
    n = a.shape[-1]
    triangle = torch.tril(a) if lower else torch.triu(a)
    a = triangle + triangle.transpose(-2, -1) - torch.diag_embed(torch.diagonal(a, 0, -2, -1))
    scale = _max_abs(a)
    a = a / scale
    a = _padded(a, (-2, -1))
    size = a.shape[-1]
    v = torch.eye(size, dtype=a.dtype, device=a.device).expand(a.shape)
    for _ in range(SWEEPS):
        for _ in range(size - 1):
            h = size // 2
            diagonal = torch.diagonal(a, 0, -2, -1)
            swapped = _halves_swapped(a, -1)
            off = torch.diagonal(swapped, 0, -2, -1)[..., :h]  # a[k, h + k]
            c, tau = _rotation(diagonal[..., :h], diagonal[..., h:], off)
            b = a * c.unsqueeze(-2) + swapped * tau.unsqueeze(-2)
            a = b * c.unsqueeze(-1) + _halves_swapped(b, -2) * tau.unsqueeze(-1)
            a = _next_round(_next_round(a, -1), -2)
            v = _next_round(v * c.unsqueeze(-2) + _halves_swapped(v, -1) * tau.unsqueeze(-2), -1)
    a = a[..., :n, :n]
    v = v[..., :n, :n]
    values = torch.diagonal(a, 0, -2, -1) * scale.squeeze(-1)
    order = _order(values, descending=False)
    values = torch.gather(values, -1, order)
    v = torch.gather(v, -1, order.unsqueeze(-2).expand(v.shape))
    return values, v


def _order(values: torch.Tensor, descending: bool) -> torch.Tensor:
    """The indices that sort each row of `values` (stable), by counting: n is small."""
    n = values.shape[-1]
    x, y = values.unsqueeze(-1), values.unsqueeze(-2)  # x: i, y: j
    before = (y > x) if descending else (y < x)
    index = torch.arange(n, device=values.device)
    tie = (y == x) & (index.unsqueeze(0) < index.unsqueeze(1))
    rank = (before | tie).to(torch.int64).sum(-1)  # position of element i
    # order[r] = the i whose rank is r
    hit = rank.unsqueeze(-2) == index.unsqueeze(-1)  # [r, i]
    return (hit.to(torch.int64) * index).sum(-1)


def _one_sided(a: torch.Tensor):
    """Hestenes Jacobi on a (m ≥ n, scaled): b = a V with orthogonal columns, and V."""
    n = a.shape[-1]
    a = _padded(a, (-1,))
    size = a.shape[-1]
    v = torch.eye(size, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], size, size)
    for _ in range(SWEEPS):
        for _ in range(size - 1):
            h = size // 2
            norms = (a * a).sum(-2)
            partners = _halves_swapped(a, -1)
            dots = (a * partners).sum(-2)
            c, tau = _rotation(norms[..., :h], norms[..., h:], dots[..., :h])
            a = _next_round(a * c.unsqueeze(-2) + partners * tau.unsqueeze(-2), -1)
            v = _next_round(v * c.unsqueeze(-2) + _halves_swapped(v, -1) * tau.unsqueeze(-2), -1)
    a = a[..., :n]
    v = v[..., :n, :n]
    return a, v


@_shared
def _orthogonalized(a: torch.Tensor):
    """(b, V, scale) with b = (a / scale) V of orthogonal columns, for a or, when it is
    wide, its transpose; scale = max |a|."""
    tall = a.transpose(-2, -1) if a.shape[-2] < a.shape[-1] else a
    scale = _max_abs(tall)
    b, v = _one_sided(tall / scale)
    return b, v, scale


def _singular_values(a: torch.Tensor) -> torch.Tensor:
    """Singular values, descending."""
    b, _, scale = _orthogonalized(a)
    values = torch.sqrt((b * b).sum(-2)) * scale.squeeze(-1)
    return torch.gather(values, -1, _order(values, descending=True))


def _complete(u: torch.Tensor, missing: list) -> torch.Tensor:
    """u (m × c, orthonormal columns except zero ones) with the columns where
    `missing[j]` (a bool tensor of the batch shape, or True) replaced by unit vectors
    orthogonal to all others: per column, the identity's column farthest from u's
    span, projected off it twice."""
    m, columns = u.shape[-2:]
    eye = torch.eye(m, dtype=u.dtype, device=u.device)
    slots = torch.arange(columns, device=u.device)
    for j, mask in enumerate(missing):
        if mask is False:
            continue
        residual = eye - u @ u.transpose(-2, -1)
        best = (residual * residual).sum(-2).argmax(-1)  # (...)
        w = torch.gather(residual, -1, best[..., None, None].expand(*u.shape[:-2], m, 1))
        for _ in range(2):
            w = w - u @ (u.transpose(-2, -1) @ w)
            w = w * torch.rsqrt((w * w).sum(-2, keepdim=True))
        chosen = slots == j
        if mask is not True:
            chosen = chosen & mask[..., None, None]
        u = torch.where(chosen, w, u)
    return u


def _svd(a: torch.Tensor, full_matrices: bool):
    """U, S (descending), Vh; U's columns for zero singular values (and beyond min(m, n)
    when `full_matrices`) complete an orthonormal basis."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    wide = m < n
    tall = a.transpose(-2, -1) if wide else a
    rows = tall.shape[-2]
    if a.numel() == 0:
        u = torch.eye(rows, rows if full_matrices else k, dtype=a.dtype, device=a.device).expand(*batch, -1, -1)
        v = torch.eye(k, dtype=a.dtype, device=a.device).expand(*batch, k, k)
        values = a.new_zeros(*batch, k)
    else:
        b, v, scale = _orthogonalized(a)
        values = torch.sqrt((b * b).sum(-2))
        order = _order(values, descending=True)
        values = torch.gather(values, -1, order)
        b = torch.gather(b, -1, order.unsqueeze(-2).expand(b.shape))
        v = torch.gather(v, -1, order.unsqueeze(-2).expand(v.shape))
        valid = values > 0
        u = b / torch.where(valid, values, torch.ones_like(values)).unsqueeze(-2)
        missing = [~valid[..., j] for j in range(k)]
        if full_matrices and rows > k:
            u = torch.cat([u, u.new_zeros(*batch, rows, rows - k)], -1)
            missing += [True] * (rows - k)
        u = _complete(u, missing)
        values = values * scale.squeeze(-1)
    if wide:  # a = (V S Uᵀ) of its transpose
        return v.contiguous(), values, u.transpose(-2, -1).contiguous()
    return u.contiguous(), values, v.transpose(-2, -1).contiguous()


@register_decomposition(aten._linalg_svd.default)
def svd(op, a, full_matrices=False, compute_uv=True, driver=None):
    """Singular vectors are an SVD's but need not have LAPACK's signs (see the module's
    docstring); svdvals traces here with compute_uv, and the unused vectors are dropped."""
    if not _applies(a):
        return NotImplemented
    if compute_uv:
        return _svd(a, full_matrices)
    empty = a.new_empty(0)
    return empty, (_singular_values(a) if a.numel() else a.new_zeros(*a.shape[:-2], min(a.shape[-2:]))), empty


@register_decomposition(aten._linalg_eigh.default)
def eigh(op, a, UPLO="L", compute_v=True):
    if not _applies(a):
        return NotImplemented
    n = a.shape[-1]
    if a.numel() == 0:
        vectors = a.new_zeros(a.shape) if compute_v else a.new_empty(0)
        return a.new_zeros(*a.shape[:-2], n), vectors
    values, vectors = _symmetric_eigen(a, UPLO.upper() == "L")
    return values, (vectors if compute_v else a.new_empty(0))


# Pseudo-inverse -----------------------------------------------------------------------


def _cutoff(a: torch.Tensor, largest: torch.Tensor, atol, rtol) -> torch.Tensor:
    """max(atol, rtol · σ₁) as torch.linalg.pinv and matrix_rank document it: atol 0 by
    default; rtol by default eps · max(m, n), or 0 where atol is given and positive.
    Tensor tolerances are per matrix (broadcast over the batch), as in eager."""
    m, n = a.shape[-2:]
    default = torch.finfo(a.dtype).eps * max(m, n)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    atol_t = zero if atol is None else torch.as_tensor(atol, dtype=a.dtype, device=a.device)
    if rtol is None:
        rtol_t = torch.full((), default, dtype=a.dtype, device=a.device)
        if atol is not None:
            rtol_t = torch.where(atol_t > 0, zero, rtol_t)
    else:
        rtol_t = torch.as_tensor(rtol, dtype=a.dtype, device=a.device)
    return torch.maximum(atol_t.unsqueeze(-1), rtol_t.unsqueeze(-1) * largest)


def _pinv(a: torch.Tensor, atol, rtol, hermitian: bool) -> torch.Tensor:
    m, n = a.shape[-2:]
    if a.numel() == 0:
        return a.new_zeros(*a.shape[:-2], n, m)
    if hermitian:
        values, v = _symmetric_eigen(a, True)
        magnitude = values.abs()
        cutoff = _cutoff(a, magnitude.amax(-1, keepdim=True), atol, rtol)
        kept = magnitude > cutoff
        inverse = torch.where(kept, 1 / torch.where(kept, values, torch.ones_like(values)), torch.zeros_like(values))
        return (v * inverse.unsqueeze(-2)) @ v.transpose(-2, -1)
    wide = m < n
    b, v, scale = _orthogonalized(a)
    values = torch.sqrt((b * b).sum(-2))  # of a / scale
    cutoff = _cutoff(a, values.amax(-1, keepdim=True) * scale.squeeze(-1), atol, rtol) / scale.squeeze(-1)
    kept = values > cutoff
    safe = torch.where(kept, values, torch.ones_like(values))
    weights = torch.where(kept, 1 / (safe * safe), torch.zeros_like(values)) / scale.squeeze(-1)
    # pinv(tall) = V Σ⁻¹ Uᵀ = V diag(1/σ²) bᵀ, as b's columns are σ_j u_j.
    result = (v * weights.unsqueeze(-2)) @ b.transpose(-2, -1)
    return result.transpose(-2, -1) if wide else result


def _pinv_entry(op, a, atol=None, rtol=None, hermitian=False):
    if not _applies(a):
        return NotImplemented
    return _pinv(a, atol, rtol, hermitian)


register_decomposition(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)(_pinv_entry)


@register_decomposition(aten.linalg_pinv.default, aten.linalg_pinv.rcond_tensor)
def pinv_rcond(op, a, rcond, hermitian=False):
    return _pinv_entry(op, a, None, rcond, hermitian)
