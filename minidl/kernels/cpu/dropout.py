"""Inverted dropout with a counter-based generator (Philox4x32-10), NumPy reference.

Draw i of a call is a function of the generator's key and (offset + i) alone, and the call then
advances the offset by the number of draws; the GPU twin computes the very same bits, so its
masks are tested against these, and a captured CUDA graph that advances the offset on the device
draws new masks at every replay.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..._types import Array

if TYPE_CHECKING:
    from ...rng import CounterRNG

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85     # Salmon et al. (2011), Philox4x32
LOW = 0xFFFFFFFF


def philox_uniform(n: int, key: tuple[int, int], offset: int) -> Array:
    """n float32 draws in [0, 1): the first word of Philox4x32-10 at counters offset .. offset+n-1,
    its top 24 bits scaled by 2^-24 (exact in float32)."""
    ctr = np.arange(n, dtype=np.uint64) + np.uint64(offset)
    c0, c1 = ctr & np.uint64(LOW), ctr >> np.uint64(32)               # 32-bit words held in uint64
    c2 = c3 = np.zeros(n, dtype=np.uint64)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m0, m1, low, s32 = np.uint64(M0), np.uint64(M1), np.uint64(LOW), np.uint64(32)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2                                     # 32 x 32 -> 64 bits: no overflow
        c0, c1, c2, c3 = (p1 >> s32) ^ c1 ^ k0, p1 & low, (p0 >> s32) ^ c3 ^ k1, p0 & low
        k0, k1 = (k0 + np.uint64(W0)) & low, (k1 + np.uint64(W1)) & low
    return (c0 >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)


def dropout_fprop(x: Array, rate: float, rng: CounterRNG, out: Array | None = None) -> tuple[Array, Array]:
    """y = x * mask, mask = (u >= rate) / (1 - rate), u ~ U[0, 1) from `rng` (key, offset); advances it.

    x (any shape) -> y, mask (x's shape and dtype).
    """
    u = philox_uniform(x.size, rng.key, int(rng.offset) + rng.skip(x.size)).reshape(x.shape)
    rng.advance(x.size)
    mask = np.where(u >= np.float32(rate), x.dtype.type(1.0 / (1.0 - rate)), x.dtype.type(0.0))
    return np.multiply(x, mask, out=out), mask


def dropout_bprop(gy: Array, mask: Array, out: Array | None = None) -> Array:
    """gx = gy * mask.   gy, mask (same shape) -> gx."""
    return np.multiply(gy, mask, out=out)
