"""Pooling on the GPU: CuPy ElementwiseKernels, one thread per output (forward) or input (backward).
Outputs lie in their input's memory order (NCHW or channels-last); channels-last arrays run as their
dense NHWC views with the channel innermost, so neighbouring threads read neighbouring values.

Channels-last max pooling over 16-byte groups of channels runs vectorised (_pool_vec.py), and an NCHW
max-pool whose windows tile the input takes its backward a window a thread, with the same results.

Backward kernels gather rather than scatter, so they need no zeroing and no atomics. Max pooling
routes the gradient to the first maximum of each window in row-major order (as PyTorch); padded
positions never win. Average pooling divides by kH*kW, padding included (PyTorch's default).
Sums are taken in ACC (float for float16/bfloat16) and rounded to T once.
"""
from __future__ import annotations

from collections.abc import Sequence

import cupy as cp
import numpy as np

from ..._types import Array
from ..shapes import PoolPlan, pool2d_plan  # noqa: F401  plans are shape arithmetic: one definition
from . import _pool_vec
from ._dtypes import ELEMENTWISE
from ._util import ACC, NHWC, channels_last, in_order, memory, out_array

DTYPES = ELEMENTWISE     # ElementwiseKernels on the type placeholder T

_P = "int32 C, int32 H, int32 W, int32 oH, int32 oW, int32 kH, int32 kW, int32 sH, int32 sW, int32 pT, int32 pL"
# Where each thread's value lies and how the kernels address x and y: NCHW, or channels-last, where the
# kernels run on the dense NHWC views (C innermost: neighbouring threads, neighbouring channels).
# XAT(h, w) / YAT(oh, ow): the index of this thread's (n, c) at that position of x / y.
_AT = {False: """
    #define XAT(hh, ww) (nc * H * W + (long long)(hh) * W + (ww))
    #define YAT(oh, ow) (nc * oH * oW + (long long)(oh) * oW + (ow))
""", True: """
    #define XAT(hh, ww) (((n * H + (hh)) * W + (ww)) * C + c)
    #define YAT(oh, ow) (((n * oH + (oh)) * oW + (ow)) * C + c)
"""}
_OUT_POS = {False: "int ow = i % oW, oh = (i / oW) % oH; long long nc = i / ((long long)oW * oH);",
            True: "int c = i % C; long long r = i / C; int ow = r % oW, oh = (r / oW) % oH;"
                  " long long n = r / ((long long)oW * oH);"}
_IN_POS = {False: "int w = i % W, h = (i / W) % H; long long nc = i / ((long long)W * H);",
           True: "int c = i % C; long long r = i / C; int w = r % W, h = (r / W) % H;"
                 " long long n = r / ((long long)W * H);"}
_WINDOW = """
    int h0 = oh * sH - pT, w0 = ow * sW - pL;
"""
# Input position (h, w) lies in the windows oh0..oh1 x ow0..ow1.
_WINDOWS = """
    int ah = h + pT - kH + 1, aw = w + pL - kW + 1;
    int oh0 = ah > 0 ? (ah + sH - 1) / sH : 0, oh1 = min(oH - 1, (h + pT) / sH);
    int ow0 = aw > 0 ? (aw + sW - 1) / sW : 0, ow1 = min(oW - 1, (w + pL) / sW);
"""
_MAX_F = """
    T m = 0; bool any = false;
    for (int kh = 0; kh < kH; ++kh) {
        int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
        for (int kw = 0; kw < kW; ++kw) {
            int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
            T v = x[XAT(hh, ww)];
            if (!any || v > m) { m = v; any = true; }
        }
    }
    y = m;
"""
_MAX_B = """
    T v = x[i];
    ACC acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) for (int ow = ow0; ow <= ow1; ++ow) {
        long long o = YAT(oh, ow);
        T m = y[o];
        if (v != m) continue;
        int h0 = oh * sH - pT, w0 = ow * sW - pL, fh = -1, fw = -1;
        for (int kh = 0; kh < kH && fh < 0; ++kh) {
            int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
            for (int kw = 0; kw < kW; ++kw) {
                int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
                if (x[XAT(hh, ww)] == m) { fh = hh; fw = ww; break; }
            }
        }
        if (fh == h && fw == w) acc += (ACC)gy[o];
    }
    gx = (T)acc;
"""
_AVG_F = """
    ACC s = 0;
    for (int kh = 0; kh < kH; ++kh) {
        int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
        for (int kw = 0; kw < kW; ++kw) {
            int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
            s += (ACC)x[XAT(hh, ww)];
        }
    }
    y = (T)(s / (ACC)(kH * kW));
"""
_AVG_B = """
    ACC acc = 0;
    for (int oh = oh0; oh <= oh1; ++oh) for (int ow = ow0; ow <= ow1; ++ow) acc += (ACC)gy[YAT(oh, ow)];
    gx = (T)(acc / (ACC)(kH * kW));
"""


def _kernels(cl):
    sfx = "_cl" if cl else ""
    out, inp = _OUT_POS[cl] + _AT[cl] + _WINDOW, _IN_POS[cl] + _AT[cl] + _WINDOWS
    return dict(
        max_f=cp.ElementwiseKernel("raw T x, " + _P, "T y", out + _MAX_F, "minidl_maxpool" + sfx, preamble=ACC),
        max_b=cp.ElementwiseKernel("raw T x, raw T y, raw T gy, " + _P, "T gx", inp + _MAX_B,
                                   "minidl_maxpool_bprop" + sfx, preamble=ACC),
        avg_f=cp.ElementwiseKernel("raw T x, " + _P, "T y", out + _AVG_F, "minidl_avgpool" + sfx, preamble=ACC),
        avg_b=cp.ElementwiseKernel("raw T gy, " + _P, "T gx", inp + _AVG_B, "minidl_avgpool_bprop" + sfx,
                                   preamble=ACC))


_K = {cl: _kernels(cl) for cl in (False, True)}
# Windows that tile the input exactly (NCHW, kH = sH, kW = sW, no padding, oH kH = H, oW kW = W: LeNet's
# 2x2 pools): a thread a window writes its kH x kW gradients, gy at the first maximum, zeros elsewhere;
# the same values as max_b's gather, at a quarter of the threads and without its search per input.
_max_b_tiled = cp.ElementwiseKernel(
    "raw T x, T y, T gy, int32 W, int32 oH, int32 oW, int32 kH, int32 kW", "raw T gx", """
    int ow = i % oW, oh = (i / oW) % oH;
    long long at0 = (i / ((long long)oW * oH)) * oH * kH * W + (long long)oh * kH * W + ow * kW;
    bool found = false;
    for (int kh = 0; kh < kH; ++kh) for (int kw = 0; kw < kW; ++kw) {
        long long at = at0 + (long long)kh * W + kw;
        bool first = !found && x[at] == y;
        gx[at] = first ? gy : (T)0;
        found |= first;
    }
    """, "minidl_maxpool_bprop_tiled")
_gavg_f = cp.ElementwiseKernel("raw T x, int32 HW", "T y", """
    ACC s = 0;
    for (int j = 0; j < HW; ++j) s += (ACC)x[i * HW + j];
    y = (T)(s / (ACC)HW);
    """, "minidl_gavgpool", preamble=ACC)
_gavg_b = cp.ElementwiseKernel("raw T gy, int32 HW", "T gx", "gx = (T)((ACC)gy[i / HW] / (ACC)HW)",
                               "minidl_gavgpool_bprop", preamble=ACC)


def _args(plan, C, x_shape):
    """The int32 geometry arguments of the kernels."""
    (H, W), (oH, oW) = x_shape[2:], plan.out_shape[2:]
    return tuple(np.int32(v) for v in (C, H, W, oH, oW, *plan.ksize, *plan.stride, plan.pads[0], plan.pads[2]))


def _y_shape(plan, x_shape):
    return (x_shape[0], x_shape[1]) + tuple(plan.out_shape[2:])


def _run(kernel, arrays, out, geometry_of):
    """kernel over `arrays` (the last one shapes the output's memory order) into `out`: on the NHWC views
    where the first array lies channels-last (the others brought into that order), else as they are."""
    cl = channels_last(arrays[0])
    views = [memory(a, True) if cl else in_order(a, False) for a in arrays]
    _K[cl][kernel](*views, *_args(*geometry_of), out.transpose(NHWC) if cl else out)
    return out


def maxpool2d_fprop(plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
    """y = max over each window.   x (N, C, H, W) -> y (N, C, oH, oW), in x's memory order."""
    cl = channels_last(x)
    y = out_array(out, _y_shape(plan, x.shape), x.dtype, cl=cl)
    if cl and _pool_vec.takes(views := [memory(x, True), y.transpose(NHWC)], x.shape[1]):
        _pool_vec.maxpool_fprop(plan, *views)
        return y
    return _run("max_f", [x], y, (plan, x.shape[1], x.shape))


def maxpool2d_bprop(plan: PoolPlan, x: Array, y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = gy routed to each window's (first) maximum.   -> gx (N, C, H, W), in x's memory order."""
    cl = channels_last(x)
    gx = out_array(out, x.shape, x.dtype, cl=cl)
    if cl and _pool_vec.takes(views := [memory(a, True) for a in (x, y, gy)] + [gx.transpose(NHWC)], x.shape[1]):
        _pool_vec.maxpool_bprop(plan, *views)
        return gx
    (H, W), (oH, oW), (kH, kW) = x.shape[2:], plan.out_shape[2:], plan.ksize
    if not cl and tuple(plan.stride) == (kH, kW) and not any(plan.pads) and (oH * kH, oW * kW) == (H, W):
        _max_b_tiled(in_order(x, False), in_order(y, False), in_order(gy, False),
                     *(np.int32(v) for v in (W, oH, oW, kH, kW)), gx)
        return gx
    return _run("max_b", [x, in_order(y, cl), in_order(gy, cl)], gx, (plan, x.shape[1], x.shape))


def avgpool2d_fprop(plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
    """y = mean over each window, padding counted.   x (N, C, H, W) -> y (N, C, oH, oW)."""
    y = out_array(out, _y_shape(plan, x.shape), x.dtype, cl=channels_last(x))
    return _run("avg_f", [x], y, (plan, x.shape[1], x.shape))


def avgpool2d_bprop(plan: PoolPlan, gy: Array, out: Array | None = None) -> Array:
    """gx = gy spread evenly over each window.   gy (N, C, oH, oW) -> gx (N, C, H, W)."""
    x_shape = (gy.shape[0], gy.shape[1]) + tuple(plan.in_shape[2:])
    gx = out_array(out, x_shape, gy.dtype, cl=channels_last(gy))
    return _run("avg_b", [gy], gx, (plan, gy.shape[1], x_shape))


def global_avgpool_fprop(x: Array, out: Array | None = None) -> Array:
    """y = mean over H, W.   x (N, C, H, W) -> y (N, C, 1, 1)."""
    y = out_array(out, x.shape[:2] + (1, 1), x.dtype)      # (N, C, 1, 1) lies in both orders
    _gavg_f(x, np.int32(x.shape[2] * x.shape[3]), y)       # a loop per (n, c): no CUB temporaries
    return y


def global_avgpool_bprop(gy: Array, x_shape: Sequence[int], out: Array | None = None) -> Array:
    """gx = gy / (H W) broadcast over H, W.   gy (N, C, 1, 1) -> gx x_shape (NCHW: the readers of a
    channels-last x bring it into their order)."""
    gx = out_array(out, x_shape, gy.dtype)
    _gavg_b(gy, np.int32(x_shape[2] * x_shape[3]), gx)
    return gx
