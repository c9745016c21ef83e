"""Constant 2-D padding on the GPU.   pads = (top, bottom, left, right). Outputs lie in their input's
memory order (NCHW, or channels-last: then the kernels run on the dense NHWC views)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import NHWC, channels_last, memory, out_array

DTYPES = ELEMENTWISE     # ElementwiseKernels on the type placeholder T

# Each thread's position: NCHW, or channels-last on the dense NHWC views (C innermost, coalesced).
_POS = {False: "int w = i % OW, h = (i / OW) % OH; long long nc = i / ((long long)OW * OH);"
               " long long base = nc * IH * IW, step = 1;",
        True: "int c = i % C; long long r = i / C; int w = r % OW, h = (r / OW) % OH;"
              " long long base = (r / ((long long)OW * OH)) * IH * IW * C + c, step = C;"}


def _kernels(cl):
    sfx = "_cl" if cl else ""
    pad = cp.ElementwiseKernel(
        "raw T x, int32 C, int32 IH, int32 IW, int32 OH, int32 OW, int32 top, int32 left, float64 value", "T y",
        _POS[cl] + """
        int hx = h - top, wx = w - left;
        y = (hx >= 0 && hx < IH && wx >= 0 && wx < IW) ? x[base + ((long long)hx * IW + wx) * step] : (T)value;
        """, "minidl_pad2d" + sfx)
    crop = cp.ElementwiseKernel(
        "raw T gy, int32 C, int32 IH, int32 IW, int32 OH, int32 OW, int32 top, int32 left", "T gx",
        _POS[cl] + "gx = gy[base + ((long long)(h + top) * IW + w + left) * step];", "minidl_pad2d_bprop" + sfx)
    return pad, crop


_K = {cl: _kernels(cl) for cl in (False, True)}


def pad2d_fprop(x: Array, pads: tuple[int, int, int, int], value: float = 0.0, out: Array | None = None) -> Array:
    """y = x surrounded by `value`.   x (N, C, H, W) -> y (N, C, H + top + bottom, W + left + right),
    in x's memory order."""
    t, b, l, r = pads
    N, C, H, W = x.shape
    cl = channels_last(x)
    y = out_array(out, (N, C, H + t + b, W + l + r), x.dtype, cl=cl)
    _K[cl][0](memory(x, cl), np.int32(C), np.int32(H), np.int32(W), np.int32(H + t + b), np.int32(W + l + r),
              np.int32(t), np.int32(l), float(value), y.transpose(NHWC) if cl else y)
    return y


def pad2d_bprop(gy: Array, pads: tuple[int, int, int, int], out: Array | None = None) -> Array:
    """gx = the interior of gy.   gy (N, C, oH, oW) -> gx (N, C, oH - top - bottom, oW - left - right),
    in gy's memory order."""
    t, b, l, r = pads
    N, C, oH, oW = gy.shape
    cl = channels_last(gy)
    gx = out_array(out, (N, C, oH - t - b, oW - l - r), gy.dtype, cl=cl)
    # crop reads gy (the padded array, IH x IW) at (h + top, w + left) of gx (OH x OW)
    _K[cl][1](memory(gy, cl), np.int32(C), np.int32(oH), np.int32(oW), np.int32(oH - t - b), np.int32(oW - l - r),
              np.int32(t), np.int32(l), gx.transpose(NHWC) if cl else gx)
    return gx
