"""Helpers shared by the NumPy kernel families.

Arrays between layers are NCHW by shape, but the CPU kernels return them in the memory order they
computed in (conv: batch innermost, CHWN), and the elementwise and pooling kernels keep their
input's order: NumPy runs an op in memory order when its operands share one, and 2-4x slower
when they do not. `order` and `like` let a kernel follow its input's order.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..._types import Array, DTypeLike

_ZEROS: dict[np.dtype, Array] = {}      # dtype -> one read-only zero buffer, grown on demand


def emit(y: Array, out: Array | None) -> Array:
    """y, or y copied into `out` when one is given (the kernels' `out=` contract)."""
    if out is None:
        return y
    out[...] = y
    return out


def order(a: Array) -> tuple[int, ...] | None:
    """The axes of `a` from outermost to innermost in memory, if its values fill one dense block
    (a C-contiguous array with permuted axes), else None."""
    return _order(a.shape, a.strides, a.itemsize)


@functools.lru_cache(maxsize=256)        # a step asks about the same few layouts again and again
def _order(shape, strides, itemsize):
    axes = sorted(range(len(shape)), key=lambda i: -strides[i])
    step = itemsize
    for i in reversed(axes):
        if shape[i] != 1 and strides[i] != step:
            return None
        step *= shape[i]
    return tuple(axes)


def like(a: Array, ref: Array) -> Array:
    """`a` with the memory order of `ref` (same shape): itself if it has it, else a copy."""
    if order(a) == order(ref):
        return a
    out = np.empty_like(ref, dtype=a.dtype)
    np.copyto(out, a)
    return out


def zeros(shape: tuple[int, ...], dtype: DTypeLike) -> Array:
    """A read-only C-contiguous zero array of `shape`: a view of one shared buffer per dtype."""
    n, dt = math.prod(shape), np.dtype(dtype)
    buf = _ZEROS.get(dt)
    if buf is None or buf.size < n:
        buf = np.zeros(max(n, 2 * (0 if buf is None else buf.size)), dt)
        buf.flags.writeable = False
        _ZEROS[dt] = buf
    return buf[:n].reshape(shape)


def zeros_like(a: Array) -> Array | None:
    """Read-only zeros in a's shape and memory order, or None when a is not one dense block.

    np.maximum(x, 0) broadcasts a scalar and NumPy runs that without SIMD; against a zero array of
    x's shape and order it runs the vector loop, 2.5-3x faster.
    """
    if order(a) is None:
        return None
    return np.ndarray(a.shape, a.dtype, buffer=zeros((a.size,), a.dtype), strides=a.strides)
