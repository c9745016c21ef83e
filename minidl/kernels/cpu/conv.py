"""2-D convolution as im2col + one matrix product (cross-correlation, as cuDNN computes it)."""
import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided


@dataclass(frozen=True)
class ConvPlan:
    in_shape: tuple      # (N, C, H, W), N may be None
    w_shape: tuple       # (K, C, kH, kW)
    out_shape: tuple     # (N, K, oH, oW)
    pads: tuple          # (top, bottom, left, right)
    stride: tuple
    dilation: tuple


def resolve_pads(padding, size, ksize, stride, dilation):
    """Padding spec -> (top, bottom, left, right); 'same' pads as TensorFlow (extra at the end)."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        pads = []
        for n, k, s, d in zip(size, ksize, stride, dilation):
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    if isinstance(padding, str):
        raise ValueError(f"unknown padding {padding!r}: expected an int, a pair, 'same' or 'valid'")
    if not isinstance(padding, (int, np.integer)) and len(padding) == 4:
        pads = tuple(int(p) for p in padding)                # (top, bottom, left, right)
        if min(pads) < 0:
            raise ValueError(f"padding must be non-negative, got {padding!r}")
        return pads
    ph, pw = (padding, padding) if isinstance(padding, (int, np.integer)) else tuple(padding)
    if min(ph, pw) < 0:
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    return (int(ph), int(ph), int(pw), int(pw))


def out_size(n, k, s, d, p0, p1):
    return (n + p0 + p1 - (k - 1) * d - 1) // s + 1


def conv2d_plan(x_shape, w_shape, stride, padding, dilation):
    N, C, H, W = x_shape
    K, _, kH, kW = w_shape
    pads = resolve_pads(padding, (H, W), (kH, kW), stride, dilation)
    oH = out_size(H, kH, stride[0], dilation[0], pads[0], pads[1])
    oW = out_size(W, kW, stride[1], dilation[1], pads[2], pads[3])
    if oH <= 0 or oW <= 0:
        raise ValueError(f"a {kH}x{kW} kernel (dilation {dilation}) does not fit a {H}x{W} input "
                         f"with padding {pads}")
    return ConvPlan(tuple(x_shape), tuple(w_shape), (N, K, oH, oW), pads, tuple(stride), tuple(dilation))


def _pad_chwn(x, pads):
    """x (N, C, H, W) -> zero-padded (C, H + t + b, W + l + r, N), the layout the kernels compute in.

    With the batch innermost, every window offset reads and writes runs of oW*N contiguous values
    (at stride 1) instead of runs of oW or kW.
    """
    t, b, l, r = pads
    N, C, H, W = x.shape
    xp = np.zeros((C, H + t + b, W + l + r, N), dtype=x.dtype)
    xp[:, t:t + H, l:l + W] = x.transpose(1, 2, 3, 0)                          # (C, H, W, N)
    return xp


def _cols(plan, x):
    """im2col: (C*kH*kW, oH*oW*N), rows (c, i, j), columns (oh, ow, n)."""
    xp = _pad_chwn(x, plan.pads)
    N, C = x.shape[:2]
    _, _, kH, kW = plan.w_shape
    oH, oW = plan.out_shape[2:]
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    c, h, w, n = xp.strides
    v = as_strided(xp, (C, kH, kW, oH, oW, N), (c, h * dh, w * dw, h * sh, w * sw, n), writeable=False)
    return v.reshape(C * kH * kW, oH * oW * N)             # (C*kH*kW, oH*oW*N), the im2col copy


def _gy_rows(gy):
    """gy (N, K, oH, oW) -> (K, oH*oW*N), the GEMM operand both gradients share."""
    return gy.transpose(1, 2, 3, 0).reshape(gy.shape[1], -1)   # (K, oH*oW*N)


def conv2d_fprop(plan, x, w, b=None, out=None):
    """x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW)."""
    N, K = x.shape[0], w.shape[0]
    oH, oW = plan.out_shape[2:]
    y = w.reshape(K, -1) @ _cols(plan, x)                   # (K, oH*oW*N)
    if b is not None:
        y += b[:, None]
    y = y.reshape(K, oH, oW, N).transpose(3, 0, 1, 2)       # (N, K, oH, oW)
    if out is None:
        return np.ascontiguousarray(y)
    out[...] = y
    return out


def conv2d_dgrad(plan, gy, w, out=None):
    """gy (N, K, oH, oW), w (K, C, kH, kW) -> gx (N, C, H, W): col2im of w^T @ gy."""
    N, K, oH, oW = gy.shape
    _, C, kH, kW = w.shape
    H, W = plan.in_shape[2:]
    t, b, l, r = plan.pads
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    gcols = (w.reshape(K, -1).T @ _gy_rows(gy)).reshape(C, kH, kW, oH, oW, N)
    gxp = np.zeros((C, H + t + b, W + l + r, N), dtype=gy.dtype)               # padded, CHWN
    # A loop over the kernel offsets only: each adds one whole strided slab.
    for i in range(kH):
        for j in range(kW):
            gxp[:, i * dh:i * dh + sh * (oH - 1) + 1:sh, j * dw:j * dw + sw * (oW - 1) + 1:sw] += gcols[:, i, j]
    gx = gxp[:, t:t + H, l:l + W].transpose(3, 0, 1, 2)                         # (N, C, H, W)
    if out is None:
        return np.ascontiguousarray(gx)
    out[...] = gx
    return out


def conv2d_wgrad(plan, x, gy, gw, accumulate=True):
    """Adds dL/dw = gy @ im2col(x)^T into gw (K, C, kH, kW); accumulate=False overwrites gw."""
    # cols @ gy^T, then a transpose of the small result: OpenBLAS runs this orientation faster
    dw = (_cols(plan, x) @ _gy_rows(gy).T).T.reshape(gw.shape)   # (C*kH*kW, K) -> (K, C, kH, kW)
    if accumulate:
        gw += dw
    else:
        gw[...] = dw
