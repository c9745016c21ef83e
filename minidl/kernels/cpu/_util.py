"""Helpers shared by the NumPy kernel families."""
import math

import numpy as np

_ZEROS = {}      # dtype -> one read-only zero buffer, grown on demand


def emit(y, out):
    """y, or y copied into `out` when one is given (the kernels' `out=` contract)."""
    if out is None:
        return y
    out[...] = y
    return out


def zeros(shape, dtype):
    """A read-only C-contiguous zero array of `shape`: a view of one shared buffer per dtype.

    np.maximum(x, 0) broadcasts a scalar and NumPy runs that without SIMD; against a zero array of
    x's shape it runs the vector loop, 2.5-3x faster (LeNet's first ReLU: 73 -> 26 us). One buffer,
    the size of the largest array asked for, serves every shape.
    """
    n, dt = math.prod(shape), np.dtype(dtype)
    buf = _ZEROS.get(dt)
    if buf is None or buf.size < n:
        buf = np.zeros(max(n, 2 * (0 if buf is None else buf.size)), dt)
        buf.flags.writeable = False
        _ZEROS[dt] = buf
    return buf[:n].reshape(shape)
