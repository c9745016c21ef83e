"""A training batch gathered in one launch, and random integer shifts and horizontal flips of a batch
of images on the GPU: the same draws as kernels.cpu.augment.

`gather_batch` copies the batch's images and labels in one kernel (a captured training step took two
`cupy.take`s), each image row as 16-byte words where the row and both addresses allow it.

One thread per output pixel recomputes its image's Philox draws (a shift: offset + 2n and
offset + 2n + 1; a flip: offset + n; both after the rank's skip, CounterRNG.skip);
the offset lives on the device and advances there, so a captured CUDA graph shifts anew at every
replay without the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import cupy as cp
import numpy as np

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import Module, out_array
from .dropout import PHILOX

if TYPE_CHECKING:
    from ...rng import CounterRNG

DTYPES = ELEMENTWISE     # a copy of pixels: T in, T out

# Image rows of R words W and int32 labels gathered by indices I, grid-stride: one launch for both.
_WORDS = {16: "uint4", 8: "unsigned long long", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}
_INDICES = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int"}
_GATHER = Module(r"""
template<typename W, typename I>
__global__ void gather_batch(const W* x, const int* y, const I* idx, W* ox, int* oy, long long B, long long R) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    for (long long j = t; j < B * R; j += stride) {
        long long b = j / R;
        ox[j] = x[(long long)idx[b] * R + (j - b * R)];
    }
    for (long long j = t; j < B; j += stride) oy[j] = y[idx[j]];
}
""", [f"gather_batch<{w}, {i}>" for w in _WORDS.values() for i in _INDICES.values()])
_BLOCKS = 1024                      # at most: grid-stride beyond


def gather_batch(x: Array, y: Array, idx: Array) -> tuple[Array, Array]:
    """(x[idx], y[idx]) in one launch: idx (B,) int64 or int32 in [0, N), x (N, ...) C-contiguous, y (N,)
    int32 (the loaders' labels). Other layouts and dtypes take two cupy.take (the same values)."""
    B = idx.shape[0] if idx.ndim == 1 else -1
    if (B < 1 or idx.dtype not in _INDICES or y.dtype != np.int32 or x.ndim < 1 or y.shape != x.shape[:1]
            or not (x.flags.c_contiguous and y.flags.c_contiguous and idx.flags.c_contiguous)):
        return cp.take(x, idx, axis=0), cp.take(y, idx, axis=0)
    ox, oy = cp.empty((B,) + x.shape[1:], x.dtype), cp.empty((B,), y.dtype)
    row = x.itemsize * (x.size // max(x.shape[0], 1))           # bytes an image
    word = next(w for w in _WORDS if row % w == 0 and x.data.ptr % w == 0 and ox.data.ptr % w == 0) if row else 1
    R = row // word
    blocks = max(1, min(_BLOCKS, -(-max(B * R, B) // 256)))
    _GATHER.get(f"gather_batch<{_WORDS[word]}, {_INDICES[idx.dtype]}>")(
        (blocks,), (256,), (x, y, idx, ox, oy, np.int64(B), np.int64(R)))
    return ox, oy


_shift = cp.ElementwiseKernel(
    "raw T x, uint64 off, uint64 skip, uint32 k0, uint32 k1, int32 H, int32 W, int32 CHW, int32 m, T fill", "T y",
    """
    long long n = i / CHW, h = (i / W) % H, w = i % W;
    unsigned long long c0 = off + skip + 2ull * (unsigned long long)n;
    unsigned long long ry = minidl_philox_first(c0, k0, k1) >> 8, rx = minidl_philox_first(c0 + 1ull, k0, k1) >> 8;
    long long dy = (long long)((ry * (unsigned long long)(2 * m + 1)) >> 24) - m;
    long long dx = (long long)((rx * (unsigned long long)(2 * m + 1)) >> 24) - m;
    bool inside = h - dy >= 0 && h - dy < H && w - dx >= 0 && w - dx < W;
    y = inside ? x[i - dy * W - dx] : fill;
    """, "minidl_random_shift", preamble=PHILOX)

_flip = cp.ElementwiseKernel(
    "raw T x, uint64 off, uint64 skip, uint32 k0, uint32 k1, int32 W, int32 CHW", "T y",
    """
    long long n = i / CHW, w = i % W;
    bool flip = (minidl_philox_first(off + skip + (unsigned long long)n, k0, k1) >> 31) != 0u;   // u >= 1/2
    y = flip ? x[i - w + (W - 1 - w)] : x[i];
    """, "minidl_random_flip", preamble=PHILOX)


def random_shift(x: Array, max_shift: int, fill: float, rng: CounterRNG, out: Array | None = None) -> Array:
    """y[n, c, h, w] = x[n, c, h - dy_n, w - dx_n] (`fill` outside), shifts uniform in
    [-max_shift, max_shift] from `rng` (key, device offset), which advances by 2N on the device.
    x (N, C, H, W) C-contiguous -> y (N, C, H, W)."""
    N, C, H, W = x.shape
    if not x.flags.c_contiguous:
        raise ValueError("random_shift: x must be C-contiguous")
    y = out_array(out, x.shape, x.dtype)
    _shift(x, rng.offset, rng.skip(2 * N), rng.key[0], rng.key[1], H, W, C * H * W, max_shift, x.dtype.type(fill), y)
    rng.advance(2 * N)
    return y


def random_flip(x: Array, rng: CounterRNG, out: Array | None = None) -> Array:
    """y[n, c, h, w] = x[n, c, h, W - 1 - w] for the images flipped (each with probability 1/2 from
    `rng`, which advances by N on the device), else x. x (N, C, H, W) C-contiguous -> y, not x itself."""
    N, C, H, W = x.shape
    if not x.flags.c_contiguous:
        raise ValueError("random_flip: x must be C-contiguous")
    y = out_array(out, x.shape, x.dtype)
    _flip(x, rng.offset, rng.skip(N), rng.key[0], rng.key[1], W, C * H * W, y)
    rng.advance(N)
    return y
