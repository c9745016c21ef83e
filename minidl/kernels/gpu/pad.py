"""Constant 2-D padding on the GPU.   pads = (top, bottom, left, right). Outputs lie in their input's
memory order (NCHW or channels-last: the kernels index logical values, CuPy maps them through the strides)."""
import cupy as cp
import numpy as np

from ._util import channels_last, out_array

DTYPES = ("float32", "float64", "float16", "bfloat16")     # ElementwiseKernels on the type placeholder T

_pad = cp.ElementwiseKernel(
    "raw T x, int32 H, int32 W, int32 oH, int32 oW, int32 top, int32 left, float64 value", "T y",
    """
    int w = i % oW, h = (i / oW) % oH;
    long long nc = i / ((long long)oW * oH);
    int hx = h - top, wx = w - left;
    y = (hx >= 0 && hx < H && wx >= 0 && wx < W) ? x[(nc * H + hx) * W + wx] : (T)value;
    """, "minidl_pad2d")
_crop = cp.ElementwiseKernel(
    "raw T gy, int32 H, int32 W, int32 oH, int32 oW, int32 top, int32 left", "T gx",
    """
    int w = i % W, h = (i / W) % H;
    long long nc = i / ((long long)W * H);
    gx = gy[(nc * oH + h + top) * oW + w + left];
    """, "minidl_pad2d_bprop")


def pad2d_fprop(x, pads, value=0.0, out=None):
    """y = x surrounded by `value`.   x (N, C, H, W) -> y (N, C, H + top + bottom, W + left + right)."""
    t, b, l, r = pads
    N, C, H, W = x.shape
    y = out_array(out, (N, C, H + t + b, W + l + r), x.dtype, cl=channels_last(x))
    _pad(x, np.int32(H), np.int32(W), np.int32(H + t + b), np.int32(W + l + r), np.int32(t), np.int32(l),
         float(value), y)
    return y


def pad2d_bprop(gy, pads, out=None):
    """gx = the interior of gy.   gy (N, C, oH, oW) -> gx (N, C, oH - top - bottom, oW - left - right)."""
    t, b, l, r = pads
    N, C, oH, oW = gy.shape
    gx = out_array(out, (N, C, oH - t - b, oW - l - r), gy.dtype, cl=channels_last(gy))
    _crop(gy, np.int32(oH - t - b), np.int32(oW - l - r), np.int32(oH), np.int32(oW), np.int32(t),
          np.int32(l), gx)
    return gx
