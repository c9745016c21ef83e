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


def _pad(x, pads):
    """Zero-pad the spatial dimensions by (top, bottom, left, right)."""
    t, b, l, r = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))


def _windows(plan, x):
    """A strided view (N, oH, oW, C, kH, kW) of the padded input: no copy yet."""
    xp = _pad(x, plan.pads)
    N, C = x.shape[:2]
    _, _, kH, kW = plan.w_shape
    oH, oW = plan.out_shape[2:]
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    n, c, h, w = xp.strides
    return as_strided(xp, (N, oH, oW, C, kH, kW), (n, h * sh, w * sw, c, h * dh, w * dw), writeable=False)


def _cols(plan, x):
    N = x.shape[0]
    oH, oW = plan.out_shape[2:]
    return _windows(plan, x).reshape(N * oH * oW, -1)       # (N*oH*oW, C*kH*kW), the im2col copy


def conv2d_fprop(plan, x, w, b=None, out=None):
    """x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW)."""
    N, K = x.shape[0], w.shape[0]
    oH, oW = plan.out_shape[2:]
    y = _cols(plan, x) @ w.reshape(K, -1).T                 # (N*oH*oW, K)
    if b is not None:
        y += b
    y = y.reshape(N, oH, oW, K).transpose(0, 3, 1, 2)       # (N, K, oH, oW)
    if out is None:
        return np.ascontiguousarray(y)
    out[...] = y
    return out


def conv2d_dgrad(plan, gy, w, out=None):
    """gy (N, K, oH, oW), w (K, C, kH, kW) -> gx (N, C, H, W): col2im of gy @ w.

    Channels-last inside, so each of the kH*kW scatter-adds moves contiguous runs of C values.
    """
    N, K, oH, oW = gy.shape
    _, C, kH, kW = w.shape
    H, W = plan.in_shape[2:]
    t, b, l, r = plan.pads
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    gcols = gy.transpose(0, 2, 3, 1).reshape(-1, K) @ w.transpose(0, 2, 3, 1).reshape(K, -1)
    gcols = gcols.reshape(N, oH, oW, kH, kW, C)
    gxp = np.zeros((N, H + t + b, W + l + r, C), dtype=gy.dtype)               # padded, NHWC
    # A loop over the kernel offsets only: each adds one whole strided slab.
    for i in range(kH):
        for j in range(kW):
            gxp[:, i * dh:i * dh + sh * (oH - 1) + 1:sh, j * dw:j * dw + sw * (oW - 1) + 1:sw] += gcols[:, :, :, i, j]
    gx = gxp[:, t:t + H, l:l + W].transpose(0, 3, 1, 2)                         # (N, C, H, W)
    if out is None:
        return np.ascontiguousarray(gx)
    out[...] = gx
    return out


def conv2d_wgrad(plan, x, gy, gw, accumulate=True):
    """Adds dL/dw = gy^T @ im2col(x) into gw (K, C, kH, kW); accumulate=False overwrites gw."""
    K = gy.shape[1]
    dw = (gy.transpose(1, 0, 2, 3).reshape(K, -1) @ _cols(plan, x)).reshape(gw.shape)   # (K, C, kH, kW)
    if accumulate:
        gw += dw
    else:
        gw[...] = dw
