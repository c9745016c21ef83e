"""A training batch gathered from the data set (`gather_batch`) and data augmentation on the device:
random integer shifts and random horizontal flips of a batch of images, NumPy reference.

Both are drawn from the device's counter-based generator (Philox4x32-10, kernels.*.dropout): a
shift of image n takes draws offset + 2n (rows) and offset + 2n + 1 (columns) and advances the
offset by 2N; a flip of image n takes draw offset + n and advances it by N. The GPU twin computes
the very same shifts and flips, so a captured training step augments anew at every replay and a
resumed run continues the same draws. Among data-parallel ranks the offset is the global batch's
(CounterRNG.skip): image n of rank r draws as image r N + n of one process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..._types import Array
from .dropout import philox_uniform

if TYPE_CHECKING:
    from ...rng import CounterRNG


def gather_batch(x: Array, y: Array, idx: Array) -> tuple[Array, Array]:
    """(x[idx], y[idx]): the batch of indices idx (B,) in [0, N) from images x (N, ...) and labels y (N,)."""
    return np.take(x, idx, axis=0), np.take(y, idx, axis=0)


def shift_draws(N: int, max_shift: int, key: tuple[int, int], offset: int) -> tuple[Array, Array]:
    """(dy, dx), each (N,) int64 uniform in [-max_shift, max_shift]: the top 24 bits r of a draw
    give (r (2 max_shift + 1)) >> 24 - max_shift, integer arithmetic with no rounding to skew it."""
    r = (philox_uniform(2 * N, key, offset) * np.float32(2.0 ** 24)).astype(np.int64)   # exact: u = r 2^-24
    s = ((r * (2 * max_shift + 1)) >> 24) - max_shift
    return s[0::2], s[1::2]


def random_shift(x: Array, max_shift: int, fill: float, rng: CounterRNG, out: Array | None = None) -> Array:
    """y[n, c, h, w] = x[n, c, h - dy_n, w - dx_n], `fill` where that falls outside the image;
    dy_n, dx_n uniform in [-max_shift, max_shift] from `rng` (key, offset), which advances by 2N (per rank).

    x (N, C, H, W) -> y (N, C, H, W).
    """
    N, C, H, W = x.shape
    dy, dx = shift_draws(N, max_shift, rng.key, int(rng.offset) + rng.skip(2 * N))
    rng.advance(2 * N)
    m = max_shift
    padded = np.full((N, C, H + 2 * m, W + 2 * m), fill, dtype=x.dtype)     # (N, C, H + 2m, W + 2m)
    padded[:, :, m:m + H, m:m + W] = x
    rows = m - dy[:, None] + np.arange(H)                                    # (N, H): source rows
    cols = m - dx[:, None] + np.arange(W)                                    # (N, W): source columns
    n, c = np.arange(N)[:, None, None, None], np.arange(C)[None, :, None, None]
    y = padded[n, c, rows[:, None, :, None], cols[:, None, None, :]]         # (N, C, H, W)
    if out is None:
        return y
    out[...] = y
    return out


def flip_draws(N: int, key: tuple[int, int], offset: int) -> Array:
    """(N,) bool: image n is flipped where the top bit of draw offset + n is set (u >= 1/2), even odds."""
    return philox_uniform(N, key, offset) >= np.float32(0.5)


def random_flip(x: Array, rng: CounterRNG, out: Array | None = None) -> Array:
    """y[n, c, h, w] = x[n, c, h, W - 1 - w] where f_n, else x[n, c, h, w]; f_n true with probability
    1/2 from `rng` (key, offset), which advances by N (per rank).

    x (N, C, H, W) -> y (N, C, H, W).
    """
    N = x.shape[0]
    f = flip_draws(N, rng.key, int(rng.offset) + rng.skip(N))
    rng.advance(N)
    y = np.where(f[:, None, None, None], x[..., ::-1], x)
    if out is None:
        return y
    out[...] = y
    return out
