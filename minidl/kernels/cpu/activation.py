"""Elementwise activations and their backward passes."""
from __future__ import annotations

import numpy as np

from ..._types import Array

from ._util import like, zeros_like

# Below this many values a broadcast 0 costs less than finding a zero array of x's layout.
ZEROS_FROM = 8192


def relu_fprop(x: Array, out: Array | None = None) -> Array:
    """y = max(x, 0)."""
    z = zeros_like(x) if x.size >= ZEROS_FROM else None     # SIMD: against zeros, not a scalar 0
    return np.maximum(x, 0 if z is None else z, out=out)


def relu_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy where y > 0 (the output tells where the input was positive); in y's memory order."""
    gy = like(gy, y)                 # mixed memory orders run 2-8x slower than one
    return np.multiply(gy, y > 0, out=np.empty_like(y, dtype=gy.dtype) if out is None else out)


def leaky_relu_fprop(x: Array, alpha: float, out: Array | None = None) -> Array:
    """y = x if x > 0 else alpha x."""
    return np.multiply(x, np.where(x > 0, 1.0, alpha).astype(x.dtype), out=out)


def leaky_relu_bprop(x: Array, gy: Array, alpha: float, out: Array | None = None) -> Array:
    return np.multiply(gy, np.where(x > 0, 1.0, alpha).astype(gy.dtype), out=out)


def sigmoid_fprop(x: Array, out: Array | None = None) -> Array:
    """y = 1 / (1 + exp(-x)), written as (1 + tanh(x/2)) / 2 so no exp overflows."""
    y = np.multiply(np.tanh(x * 0.5, out=out), 0.5, out=out)
    return np.add(y, 0.5, out=y)


def sigmoid_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy y (1 - y)."""
    return np.multiply(gy, y * (1 - y), out=out)


def tanh_fprop(x: Array, out: Array | None = None) -> Array:
    return np.tanh(x, out=out)


def tanh_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy (1 - y^2)."""
    return np.multiply(gy, 1 - y * y, out=out)
