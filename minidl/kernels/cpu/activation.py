"""Elementwise activations: any activation's expression (`elementwise`), and ReLU's own pair.

The activations are written once, as expressions over the array module in their layers
(minidl/layers/activation.py); `elementwise` computes one with NumPy. ReLU keeps its kernels, which
run faster than its expression (SIMD against a zero array, the output's memory order for gy).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..._types import Array

from ._util import like, zeros_like

# Below this many values a broadcast 0 costs less than finding a zero array of x's layout.
ZEROS_FROM = 8192


def elementwise(fn: Callable[..., Array], *arrays: Array) -> Array:
    """fn(np, *arrays) in the first array's dtype and memory order (the others follow its order: mixed
    orders run 2-8x slower). Half-precision storage reaches here as float32 (kernels/cpu/storage.py)."""
    first = arrays[0]
    y = fn(np, first, *(like(a, first) if isinstance(a, np.ndarray) else a for a in arrays[1:]))
    return y if y.dtype == first.dtype else y.astype(first.dtype)


def relu_fprop(x: Array, out: Array | None = None) -> Array:
    """y = max(x, 0)."""
    z = zeros_like(x) if x.size >= ZEROS_FROM else None     # SIMD: against zeros, not a scalar 0
    return np.maximum(x, 0 if z is None else z, out=out)


def relu_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy where y > 0 (the output tells where the input was positive); in y's memory order."""
    gy = like(gy, y)                 # mixed memory orders run 2-8x slower than one
    return np.multiply(gy, y > 0, out=np.empty_like(y, dtype=gy.dtype) if out is None else out)
