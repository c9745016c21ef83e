"""Activations on the GPU: any activation's expression (`elementwise`, CuPy's ufuncs), and one fused
CuPy ElementwiseKernel per function and per gradient for ReLU, LeakyReLU, Sigmoid and Tanh (the
contract's extras: the layers run these where the family has them).

The activations are written once, as expressions over the array module in their layers
(minidl/layers/activation.py). In float16/bfloat16 (CuPy's classes, read as float) each fused kernel
computes in float (ACC) and rounds once, to T, when it writes; an expression computes on float32
copies and is rounded once at its end.
"""
from __future__ import annotations

from typing import Callable

import cupy as cp
import numpy as np

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import ACC, RELU, RELU_BPROP, channels_last, memory, pointwise

DTYPES = ELEMENTWISE     # ElementwiseKernels on the type placeholder T


def _kernel(params, out, body, name):
    return cp.ElementwiseKernel(params, out, body, name, preamble=ACC)


_leaky = _kernel("T x, float64 alpha", "T y", "y = x > (T)0 ? x : (T)((ACC)alpha * (ACC)x)", "minidl_leaky")
_leaky_b = _kernel("T x, T gy, float64 alpha", "T gx", "gx = x > (T)0 ? gy : (T)((ACC)alpha * (ACC)gy)",
                   "minidl_leaky_bprop")
_sigmoid = _kernel("T x", "T y", "y = (T)((ACC)1 / ((ACC)1 + exp(-(ACC)x)))", "minidl_sigmoid")
_sigmoid_b = _kernel("T y, T gy", "T gx", "ACC s = y; gx = (T)((ACC)gy * s * ((ACC)1 - s))", "minidl_sigmoid_bprop")
_tanh = _kernel("T x", "T y", "y = (T)tanh((ACC)x)", "minidl_tanh")
_tanh_b = _kernel("T y, T gy", "T gx", "ACC t = y; gx = (T)((ACC)gy * ((ACC)1 - t * t))", "minidl_tanh_bprop")


def elementwise(fn: Callable[..., Array], *arrays: Array) -> Array:
    """fn(cp, *arrays) in the first array's dtype and memory order: a channels-last batch is computed on
    its dense NHWC views (the others copied into that order where they lie otherwise), half-precision
    arrays on float32 copies, rounded once. CuPy's elementwise ufuncs read nothing from the host, so a
    captured step records them as they are."""
    first = arrays[0]
    cl = channels_last(first)
    views = [_wide(memory(a, True) if cl and a.ndim == 4 else a) if isinstance(a, cp.ndarray) else a
             for a in arrays]
    y = fn(cp, *views)
    if y.dtype != first.dtype:
        y = y.astype(first.dtype)
    return y.transpose(0, 3, 1, 2) if cl else y


def _wide(a):
    """a, or a float32 copy where it is float16 or bfloat16."""
    return a.astype(np.float32) if a.dtype.itemsize == 2 and a.dtype.kind in "fV" else a


def _call(kern, *args, out=None):
    return pointwise(kern, *args, out=out)


def relu_fprop(x: Array, out: Array | None = None) -> Array:
    """y = max(x, 0)."""
    return _call(RELU, x, out=out)


def relu_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy where y > 0, else 0."""
    return _call(RELU_BPROP, y, gy, out=out)


def leaky_relu_fprop(x: Array, alpha: float, out: Array | None = None) -> Array:
    """y = x if x > 0 else alpha x."""
    return _call(_leaky, x, alpha, out=out)


def leaky_relu_bprop(x: Array, gy: Array, alpha: float, out: Array | None = None) -> Array:
    """gx = gy if x > 0 else alpha gy."""
    return _call(_leaky_b, x, gy, alpha, out=out)


def sigmoid_fprop(x: Array, out: Array | None = None) -> Array:
    """y = 1 / (1 + exp(-x))."""
    return _call(_sigmoid, x, out=out)


def sigmoid_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy y (1 - y)."""
    return _call(_sigmoid_b, y, gy, out=out)


def tanh_fprop(x: Array, out: Array | None = None) -> Array:
    """y = tanh(x)."""
    return _call(_tanh, x, out=out)


def tanh_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy (1 - y^2)."""
    return _call(_tanh_b, y, gy, out=out)
