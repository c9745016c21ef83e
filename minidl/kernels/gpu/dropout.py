"""Inverted dropout on the GPU: Philox4x32-10 counter-based draws, the same bits as the CPU kernel.

The counter offset lives on the device (a 0-d uint64) and the kernel's caller advances it there,
so a captured CUDA graph draws a new mask at every replay without the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import cupy as cp

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import channels_last, out_array, pointwise

if TYPE_CHECKING:
    from ...rng import CounterRNG

DTYPES = ELEMENTWISE     # y = x mask in T; the draws are float32 on both devices

PHILOX = r"""
__device__ unsigned int minidl_philox_first(unsigned long long ctr, unsigned int k0, unsigned int k1) {
    unsigned int c0 = (unsigned int)ctr, c1 = (unsigned int)(ctr >> 32), c2 = 0u, c3 = 0u;
    for (int r = 0; r < 10; ++r) {
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    return c0;
}
"""
_fwd = cp.ElementwiseKernel(
    "T x, uint64 off, uint64 skip, uint32 k0, uint32 k1, float32 rate, float64 scale", "T y, T mask",
    """
    float u = (float)(minidl_philox_first(off + skip + (unsigned long long)i, k0, k1) >> 8) * (1.0f / 16777216.0f);
    mask = u >= rate ? (T)scale : (T)0;
    y = (T)(x * mask);                       // half types: the product in float, rounded once
    """, "minidl_dropout_philox", preamble=PHILOX)
_uniform = cp.ElementwiseKernel(
    "uint64 off, uint32 k0, uint32 k1", "float32 u",
    "u = (float)(minidl_philox_first(off + (unsigned long long)i, k0, k1) >> 8) * (1.0f / 16777216.0f);",
    "minidl_philox_uniform", preamble=PHILOX)


def philox_uniform(n: int, key: tuple[int, int], offset: int) -> Array:
    """n float32 draws in [0, 1), as kernels.cpu.dropout.philox_uniform (for tests)."""
    return _uniform(cp.asarray(offset, dtype=cp.uint64), key[0], key[1], cp.empty(n, cp.float32))


def dropout_fprop(x: Array, rate: float, rng: CounterRNG,
                  out: Array | tuple[Array, Array] | None = None) -> tuple[Array, Array]:
    """y = x mask with mask 1/(1-rate) w.p. 1-rate, else 0.  -> (y, mask). `out` is y or (y, mask).
    Draws from `rng` (key, device offset) and advances its offset on the device."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    cl = channels_last(x)             # the draws follow memory order: the i-th value in memory, the i-th draw
    y, mask = (out_array(o, x.shape, x.dtype, cl=cl) for o in (out if isinstance(out, (tuple, list)) else (out, None)))
    pointwise(_fwd, x, rng.offset, rng.skip(x.size), rng.key[0], rng.key[1], rate, 1.0 / (1.0 - rate), y, mask)
    rng.advance(x.size)
    return y, mask


def dropout_bprop(gy: Array, mask: Array, out: Array | None = None) -> Array:
    """gx = gy mask (the mask holds 0 or 1/(1-rate))."""
    return pointwise(cp.multiply, gy, mask, out=out)
