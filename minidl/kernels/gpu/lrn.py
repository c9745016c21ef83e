"""Local response normalisation across channels on the GPU (cuDNN/Caffe definition).

scale = k + alpha/size * sum of x^2 over channels c - (size-1)//2 .. c + size//2 (clipped);
y = x scale^-beta.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from ._dtypes import FLOAT_DOUBLE
from ._util import out_arrays

DTYPES = FLOAT_DOUBLE     # ElementwiseKernels on the type placeholder T

_INDEX = """
    int s = i % HW, c = (i / HW) % C;
    long long base = (i / ((long long)HW * C)) * C * HW + s;
"""
_fwd = cp.ElementwiseKernel("raw T x, int32 C, int32 HW, int32 size, T alpha, T beta, T k", "T y, T scale",
                            _INDEX + """
    int lo = max(0, c - (size - 1) / 2), hi = min(C - 1, c + size / 2);
    T acc = 0;
    for (int cc = lo; cc <= hi; ++cc) { T v = x[base + (long long)cc * HW]; acc += v * v; }
    T sc = k + alpha / (T)size * acc;
    scale = sc;
    y = x[i] * pow(sc, -beta);
    """, "minidl_lrn")
# gx = gy scale^-beta - 2 alpha beta / size * x * sum over the channels c' whose window holds c
# of gy y / scale at c'.
_bwd = cp.ElementwiseKernel("raw T x, raw T y, raw T scale, raw T gy, int32 C, int32 HW, int32 size, T alpha, T beta",
                            "T gx", _INDEX + """
    int lo = max(0, c - size / 2), hi = min(C - 1, c + (size - 1) / 2);
    T acc = 0;
    for (int cc = lo; cc <= hi; ++cc) { long long j = base + (long long)cc * HW; acc += gy[j] * y[j] / scale[j]; }
    gx = gy[i] * pow(scale[i], -beta) - (T)2 * alpha * beta / (T)size * x[i] * acc;
    """, "minidl_lrn_bprop")


def lrn_fprop(x: Array, size: int, alpha: float, beta: float, k: float,
              out: Array | None = None) -> tuple[Array, Array]:
    """-> (y, scale), both (N, C, H, W). `out` is y or a tuple (y, scale)."""
    N, C = x.shape[:2]
    y, scale = out_arrays(out, [(x.shape, x.dtype), (x.shape, x.dtype)])
    _fwd(x, np.int32(C), np.int32(x.size // max(N * C, 1)), np.int32(size), alpha, beta, k, y, scale)
    return y, scale


def lrn_bprop(x: Array, y: Array, scale: Array, gy: Array, size: int, alpha: float, beta: float, k: float,
              out: Array | None = None) -> Array:
    """gx of lrn_fprop.   x, y, scale, gy (N, C, H, W) -> gx."""
    N, C = x.shape[:2]
    gx, = out_arrays(out, [(x.shape, x.dtype)])
    _bwd(x, y, scale, gy, np.int32(C), np.int32(x.size // max(N * C, 1)), np.int32(size), alpha, beta, gx)
    return gx
