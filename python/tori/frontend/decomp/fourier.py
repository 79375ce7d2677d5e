"""Discrete Fourier transforms in real torch ops, on complex values held as (real,
imaginary) pairs of real tensors: what `_fft_r2c`, `_fft_c2c` and `_fft_c2r` become in
tori (frontend/complex_values.py). Any length, any dims, every normalization mode.

A transform along one dim is a matmul by the DFT matrix when the length is at most
`DIRECT_MAX` (a length-400 spectrogram frame is one [frames, 400] x [400, 402] matmul,
which IREE data-tiles); longer ones factor as n = a * b (Cooley-Tukey's four steps: a
transform of length a, a twiddle multiply, one of length b, each a matmul again); a
prime length above `DIRECT_MAX` goes through Bluestein's chirp convolution, computed by
transforms of a power-of-two length. The tables (DFT matrices, twiddles, chirps) are
computed as the graph is traced, in float64 with the phase j * k reduced modulo n in
integers, rounded once to the graph's dtype, and held as constants of the graph:
computed in the graph, each table was some forty ops of tori's sin and cos that
iree-compile evaluated again on every compile (a 2-D rfft and irfft of 2x6x7 took
9.7 s to compile).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

DIRECT_MAX = 512

Pair = tuple[torch.Tensor, torch.Tensor]


@lru_cache(maxsize=64)
def _angles(rows: int, columns: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2π (j * k mod n) / n, j < rows, k < columns, in float64."""
    phase = np.remainder(np.arange(rows, dtype=np.int64)[:, None] * np.arange(columns, dtype=np.int64)[None, :], n)
    angle = phase * (2 * math.pi / n)
    cos, sin = np.cos(angle), np.sin(angle)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def _constant(table: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A float64 table as a constant of the traced graph, in `like`'s dtype and device.
    The table is rounded before it becomes a tensor: a float64 constant converted in
    the graph would reach IREE as float64, which targets without it cannot take."""
    if like.dtype in (torch.float32, torch.float64, torch.float16):
        return torch.tensor(table.astype(np.dtype(str(like.dtype).removeprefix("torch."))), device=like.device)
    return torch.tensor(table.astype(np.float32), device=like.device).to(like.dtype)


def _matmul_last(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """x [..., n] @ matrix [n, m] along the last dim."""
    shape = x.shape
    return torch.mm(x.reshape(-1, shape[-1]), matrix).reshape(*shape[:-1], matrix.shape[1])


def _smallest_factor(n: int) -> int:
    """The divisor of n nearest below its square root (1 for a prime)."""
    for a in range(math.isqrt(n), 1, -1):
        if n % a == 0:
            return a
    return 1


def dft(z: Pair, sign: int) -> Pair:
    """Σ_j z[..., j] · exp(sign · 2πi jk / n) along the last dim (sign -1: forward)."""
    re, im = z
    n = re.shape[-1]
    if n == 1:
        return re, im
    if n <= DIRECT_MAX:
        return _direct(z, sign)
    a = _smallest_factor(n)
    if a == 1:
        return _bluestein(z, sign)
    return _four_step(z, sign, a, n // a)


def _direct(z: Pair, sign: int) -> Pair:
    re, im = z
    n = re.shape[-1]
    cos, sin = _angles(n, n, n)
    # [re, im] @ [[cos, sign·sin], [-sign·sin, cos]]: both parts in one matmul.
    matrix = _constant(np.block([[cos, sign * sin], [-sign * sin, cos]]), re)
    out = _matmul_last(torch.cat([re, im], -1), matrix)
    return out[..., :n], out[..., n:]


def _multiply(z: Pair, w: Pair) -> Pair:
    (a, b), (c, d) = z, w
    return a * c - b * d, a * d + b * c


def _four_step(z: Pair, sign: int, a: int, b: int) -> Pair:
    """n = a·b: input index j1·b + j2, output index k1 + a·k2."""
    n = a * b
    batch = z[0].shape[:-1]
    # [..., j1, j2] -> [..., j2, j1]: transforms of length a over j1.
    parts = tuple(p.reshape(*batch, a, b).transpose(-1, -2) for p in z)
    parts = dft(parts, sign)
    cos, sin = _angles(b, a, n)  # W_n^(j2·k1)
    parts = _multiply(parts, (_constant(cos, parts[0]), _constant(sign * sin, parts[0])))
    # [..., j2, k1] -> [..., k1, j2]: transforms of length b over j2, giving [..., k1, k2].
    parts = dft(tuple(p.transpose(-1, -2) for p in parts), sign)
    return tuple(p.transpose(-1, -2).reshape(*batch, n) for p in parts)


def _bluestein(z: Pair, sign: int) -> Pair:
    """jk = (j² + k² - (k - j)²) / 2: the transform is a convolution with the chirp
    exp(-sign·πi m² / n), done by power-of-two transforms of a length m >= 2n - 1."""
    re, im = z
    n = re.shape[-1]
    size = 1 << (2 * n - 2).bit_length()
    m = np.arange(n, dtype=np.int64)
    angle = np.remainder(m * m, 2 * n) * (math.pi / n)
    cos, sin = np.cos(angle), sign * np.sin(angle)  # exp(sign·πi m²/n)
    chirp = (_constant(cos, re), _constant(sin, re))
    pad = [0, size - n]
    weighted = tuple(torch.nn.functional.pad(p, pad) for p in _multiply(z, chirp))
    # The kernel exp(-sign·πi m²/n) at offsets -(n-1) .. n-1, wrapped around `size`, and
    # its transform (float64 numpy): tables as well.
    kernel = np.concatenate([cos, np.zeros(size - 2 * n + 1), cos[1:][::-1]]) - 1j * np.concatenate(
        [sin, np.zeros(size - 2 * n + 1), sin[1:][::-1]])
    spectrum = np.fft.fft(kernel)
    product = _multiply(dft(weighted, -1), (_constant(spectrum.real, re), _constant(spectrum.imag, re)))
    conv = dft(product, 1)
    conv = tuple(p[..., :n] / size for p in conv)
    return _multiply(conv, chirp)


def along(z: Pair, dim: int, fn) -> Pair:
    """fn applied to z with `dim` moved last, then moved back."""
    moved = tuple(p.movedim(dim, -1) for p in z)
    return tuple(p.movedim(-1, dim) for p in fn(moved))


def _scale(normalization: int, n: int) -> float:
    # ATen's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n.
    return 1.0 if normalization == 0 else 1 / math.sqrt(n) if normalization == 1 else 1 / n


def _normalized(z: Pair, normalization: int, n: int) -> Pair:
    scale = _scale(normalization, n)
    return z if scale == 1 else tuple(p * scale for p in z)


def c2c(z: Pair, dims: list[int], normalization: int, forward: bool) -> Pair:
    sign = -1 if forward else 1
    for dim in dims:
        z = along(z, dim, lambda p: dft(p, sign))
    return _normalized(z, normalization, math.prod(z[0].shape[d] for d in dims))


def r2c(x: torch.Tensor, dims: list[int], normalization: int, onesided: bool) -> torch.Tensor:
    """The forward transform of a real tensor, as real pairs (shape + [2]); onesided
    keeps n // 2 + 1 entries of the last dim in `dims` (the rest is their conjugate
    mirror). A single short transform is one matmul whose columns interleave the
    parts, giving the pairs without a copy."""
    *rest, last = dims
    n = x.shape[last]
    kept = n // 2 + 1 if onesided else n
    scale = _scale(normalization, math.prod(x.shape[d] for d in dims))
    if n <= DIRECT_MAX and not rest:
        cos, sin = _angles(n, kept, n)
        matrix = _constant(np.stack([cos, -sin], -1).reshape(n, 2 * kept) * scale, x)
        out = _matmul_last(x.movedim(last, -1), matrix)
        return out.reshape(*out.shape[:-1], kept, 2).movedim(-2, last if last >= 0 else last - 1)

    def real_dft(moved: Pair) -> Pair:
        full = dft((moved[0], torch.zeros_like(moved[0])), -1)
        return tuple(p[..., :kept] for p in full)

    z = along((x, x), last, real_dft)
    for dim in reversed(rest):
        z = along(z, dim, lambda p: dft(p, -1))
    return torch.stack([p * scale for p in z], -1) if scale != 1 else torch.stack(z, -1)


def _single(count: int, n: int) -> np.ndarray:
    """Which of the entries 0 .. count - 1 of a length-n spectrum have no mirror
    image: 0, and n / 2 for even n."""
    k = np.arange(count)
    return (k == 0) | (k * 2 == n)


def c2r(z: Pair, dims: list[int], normalization: int, last_dim_size: int) -> torch.Tensor:
    """The inverse transform to a real tensor whose last dim in `dims` has
    `last_dim_size` entries, of which z holds the first n // 2 + 1 (the rest mirror
    them). The imaginary parts of entry 0 and of entry n / 2 are ignored, as eager's are."""
    *rest, last = dims
    n = last_dim_size
    kept = n // 2 + 1
    for dim in rest:
        z = along(z, dim, lambda p: dft(p, 1))
    size = z[0].shape[last]
    if size > kept:
        z = tuple(p.narrow(last, 0, kept) for p in z)
    elif size < kept:
        z = tuple(torch.nn.functional.pad(p.movedim(last, -1), [0, kept - size]).movedim(-1, last) for p in z)

    def real_idft(moved: Pair) -> Pair:
        re, im = moved
        if n <= DIRECT_MAX:
            cos, sin = _angles(kept, n, n)
            # Entries 1 .. (n - 1) // 2 stand for themselves and their mirror.
            weight = np.where(_single(kept, n), 1.0, 2.0)[:, None]
            matrix = _constant(np.concatenate([weight * cos, -weight * sin], 0), re)
            out = _matmul_last(torch.cat([re, im], -1), matrix)
            return out, out
        # The mirror: entries n - kept .. 1, conjugated; entry 0's imaginary part (and n / 2's
        # for even n) is dropped, as eager drops it.
        pair = torch.stack([re, im], -1)
        mirror = pair[..., 1:n - kept + 1, :].flip(-2)
        mirror = torch.stack([mirror[..., 0], -mirror[..., 1]], -1)
        middle = pair[..., 1:kept - 1 if n % 2 == 0 else kept, :]
        ends = [torch.stack([re[..., :1], torch.zeros_like(re[..., :1])], -1)]
        last_real = [torch.stack([re[..., kept - 1:kept], torch.zeros_like(re[..., :1])], -1)] if n % 2 == 0 else []
        full = torch.cat([*ends, middle, *last_real, mirror], -2)
        out = dft((full[..., 0], full[..., 1]), 1)[0]
        return out, out

    out = along(z, last, real_idft)[0]
    sizes = [out.shape[d] for d in dims]
    return _normalized((out, out), normalization, math.prod(sizes))[0]
