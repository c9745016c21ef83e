"""Pooling on the GPU: CuPy ElementwiseKernels, one thread per output (forward) or input (backward).
Outputs lie in their input's memory order (NCHW or channels-last): the kernels index the logical
value, and CuPy maps it through the strides.

Backward kernels gather rather than scatter, so they need no zeroing and no atomics. Max pooling
routes the gradient to the first maximum of each window in row-major order (as PyTorch); padded
positions never win. Average pooling divides by kH*kW, padding included (PyTorch's default).
Sums are taken in ACC (float for float16/bfloat16) and rounded to T once.
"""
import cupy as cp
import numpy as np

from ..cpu.pool import PoolPlan, pool2d_plan  # noqa: F401  plans are shape arithmetic: one definition
from ._util import ACC, channels_last, out_array

DTYPES = ("float32", "float64", "float16", "bfloat16")     # ElementwiseKernels on the type placeholder T

_P = "int32 H, int32 W, int32 oH, int32 oW, int32 kH, int32 kW, int32 sH, int32 sW, int32 pT, int32 pL"
_OUT_INDEX = """
    int ow = i % oW, oh = (i / oW) % oH;
    long long nc = i / ((long long)oW * oH), xb = nc * H * W;
    int h0 = oh * sH - pT, w0 = ow * sW - pL;
"""
# Input position (h, w) lies in the windows oh0..oh1 x ow0..ow1.
_IN_INDEX = """
    int w = i % W, h = (i / W) % H;
    long long nc = i / ((long long)W * H), xb = nc * H * W, yb = nc * oH * oW;
    int ah = h + pT - kH + 1, aw = w + pL - kW + 1;
    int oh0 = ah > 0 ? (ah + sH - 1) / sH : 0, oh1 = min(oH - 1, (h + pT) / sH);
    int ow0 = aw > 0 ? (aw + sW - 1) / sW : 0, ow1 = min(oW - 1, (w + pL) / sW);
"""
_max_f = cp.ElementwiseKernel("raw T x, " + _P, "T y", _OUT_INDEX + """
    T m = 0; bool any = false;
    for (int kh = 0; kh < kH; ++kh) {
        int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
        for (int kw = 0; kw < kW; ++kw) {
            int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
            T v = x[xb + hh * W + ww];
            if (!any || v > m) { m = v; any = true; }
        }
    }
    y = m;
    """, "minidl_maxpool", preamble=ACC)
_max_b = cp.ElementwiseKernel("raw T x, raw T y, raw T gy, " + _P, "T gx", _IN_INDEX + """
    T v = x[i];
    ACC acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) for (int ow = ow0; ow <= ow1; ++ow) {
        long long o = yb + oh * oW + ow;
        T m = y[o];
        if (v != m) continue;
        int h0 = oh * sH - pT, w0 = ow * sW - pL, fh = -1, fw = -1;
        for (int kh = 0; kh < kH && fh < 0; ++kh) {
            int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
            for (int kw = 0; kw < kW; ++kw) {
                int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
                if (x[xb + hh * W + ww] == m) { fh = hh; fw = ww; break; }
            }
        }
        if (fh == h && fw == w) acc += (ACC)gy[o];
    }
    gx = (T)acc;
    """, "minidl_maxpool_bprop", preamble=ACC)
_avg_f = cp.ElementwiseKernel("raw T x, " + _P, "T y", _OUT_INDEX + """
    ACC s = 0;
    for (int kh = 0; kh < kH; ++kh) {
        int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
        for (int kw = 0; kw < kW; ++kw) {
            int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
            s += (ACC)x[xb + hh * W + ww];
        }
    }
    y = (T)(s / (ACC)(kH * kW));
    """, "minidl_avgpool", preamble=ACC)
_avg_b = cp.ElementwiseKernel("raw T gy, " + _P, "T gx", _IN_INDEX + """
    ACC acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) for (int ow = ow0; ow <= ow1; ++ow) acc += (ACC)gy[yb + oh * oW + ow];
    gx = (T)(acc / (ACC)(kH * kW));
    """, "minidl_avgpool_bprop", preamble=ACC)
_gavg_f = cp.ElementwiseKernel("raw T x, int32 HW", "T y", """
    ACC s = 0;
    for (int j = 0; j < HW; ++j) s += (ACC)x[i * HW + j];
    y = (T)(s / (ACC)HW);
    """, "minidl_gavgpool", preamble=ACC)
_gavg_b = cp.ElementwiseKernel("raw T gy, int32 HW", "T gx", "gx = (T)((ACC)gy[i / HW] / (ACC)HW)",
                               "minidl_gavgpool_bprop", preamble=ACC)


def _args(plan, x_shape):
    """The int32 geometry arguments of the kernels."""
    (H, W), (oH, oW) = x_shape[2:], plan.out_shape[2:]
    return tuple(np.int32(v) for v in (H, W, oH, oW, *plan.ksize, *plan.stride, plan.pads[0], plan.pads[2]))


def _y_shape(plan, x_shape):
    return (x_shape[0], x_shape[1]) + tuple(plan.out_shape[2:])


def maxpool2d_fprop(plan, x, out=None):
    """y = max over each window.   x (N, C, H, W) -> y (N, C, oH, oW)."""
    y = out_array(out, _y_shape(plan, x.shape), x.dtype, cl=channels_last(x))
    _max_f(x, *_args(plan, x.shape), y)
    return y


def maxpool2d_bprop(plan, x, y, gy, out=None):
    """gx = gy routed to each window's (first) maximum.   -> gx (N, C, H, W)."""
    gx = out_array(out, x.shape, x.dtype, cl=channels_last(x))
    _max_b(x, y, gy, *_args(plan, x.shape), gx)
    return gx


def avgpool2d_fprop(plan, x, out=None):
    """y = mean over each window, padding counted.   x (N, C, H, W) -> y (N, C, oH, oW)."""
    y = out_array(out, _y_shape(plan, x.shape), x.dtype, cl=channels_last(x))
    _avg_f(x, *_args(plan, x.shape), y)
    return y


def avgpool2d_bprop(plan, gy, out=None):
    """gx = gy spread evenly over each window.   gy (N, C, oH, oW) -> gx (N, C, H, W)."""
    x_shape = (gy.shape[0], gy.shape[1]) + tuple(plan.in_shape[2:])
    gx = out_array(out, x_shape, gy.dtype, cl=channels_last(gy))
    _avg_b(gy, *_args(plan, x_shape), gx)
    return gx


def global_avgpool_fprop(x, out=None):
    """y = mean over H, W.   x (N, C, H, W) -> y (N, C, 1, 1)."""
    y = out_array(out, x.shape[:2] + (1, 1), x.dtype)      # (N, C, 1, 1) lies in both orders
    _gavg_f(x, np.int32(x.shape[2] * x.shape[3]), y)       # a loop per (n, c): no CUB temporaries
    return y


def global_avgpool_bprop(gy, x_shape, out=None):
    """gx = gy / (H W) broadcast over H, W.   gy (N, C, 1, 1) -> gx x_shape (NCHW: the readers of a
    channels-last x bring it into their order)."""
    gx = out_array(out, x_shape, gy.dtype)
    _gavg_b(gy, np.int32(x_shape[2] * x_shape[3]), gx)
    return gx
