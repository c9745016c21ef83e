"""Activations on the GPU: one CuPy ElementwiseKernel per function and per gradient.

In float16/bfloat16 (CuPy's classes, read as float) each kernel computes in float (ACC) and rounds
once, to T, when it writes.
"""
from __future__ import annotations

import cupy as cp

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import ACC, RELU, RELU_BPROP, pointwise

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
