"""Activations on the GPU: one CuPy ElementwiseKernel per function and per gradient."""
import cupy as cp

from ._util import RELU, RELU_BPROP

DTYPES = ("float32", "float64")     # ElementwiseKernels on the type placeholder T

_leaky = cp.ElementwiseKernel("T x, T alpha", "T y", "y = x > (T)0 ? x : alpha * x", "minidl_leaky")
_leaky_b = cp.ElementwiseKernel("T x, T gy, T alpha", "T gx", "gx = x > (T)0 ? gy : alpha * gy",
                                "minidl_leaky_bprop")
_sigmoid = cp.ElementwiseKernel("T x", "T y", "y = (T)1 / ((T)1 + exp(-x))", "minidl_sigmoid")
_sigmoid_b = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = gy * y * ((T)1 - y)", "minidl_sigmoid_bprop")
_tanh = cp.ElementwiseKernel("T x", "T y", "y = tanh(x)", "minidl_tanh")
_tanh_b = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = gy * ((T)1 - y * y)", "minidl_tanh_bprop")


def _call(kern, *args, out=None):
    return kern(*args) if out is None else kern(*args, out)


def relu_fprop(x, out=None):
    """y = max(x, 0)."""
    return _call(RELU, x, out=out)


def relu_bprop(y, gy, out=None):
    """gx = gy where y > 0, else 0."""
    return _call(RELU_BPROP, y, gy, out=out)


def leaky_relu_fprop(x, alpha, out=None):
    """y = x if x > 0 else alpha x."""
    return _call(_leaky, x, alpha, out=out)


def leaky_relu_bprop(x, gy, alpha, out=None):
    """gx = gy if x > 0 else alpha gy."""
    return _call(_leaky_b, x, gy, alpha, out=out)


def sigmoid_fprop(x, out=None):
    """y = 1 / (1 + exp(-x))."""
    return _call(_sigmoid, x, out=out)


def sigmoid_bprop(y, gy, out=None):
    """gx = gy y (1 - y)."""
    return _call(_sigmoid_b, y, gy, out=out)


def tanh_fprop(x, out=None):
    """y = tanh(x)."""
    return _call(_tanh, x, out=out)


def tanh_bprop(y, gy, out=None):
    """gx = gy (1 - y^2)."""
    return _call(_tanh_b, y, gy, out=out)
