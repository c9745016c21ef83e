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


def _windows(plan, x):
    """A strided view (C, kH, kW, oH, oW, N) of the padded CHWN input: no copy yet."""
    xp = _pad_chwn(x, plan.pads)
    N, C = x.shape[:2]
    _, _, kH, kW = plan.w_shape
    oH, oW = plan.out_shape[2:]
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    c, h, w, n = xp.strides
    return as_strided(xp, (C, kH, kW, oH, oW, N), (c, h * dh, w * dw, h * sh, w * sw, n), writeable=False)


def _row_chunks(plan, N):
    """Output-row ranges of about CHUNK_COLUMNS im2col columns each (at least one row)."""
    oH, oW = plan.out_shape[2:]
    rows = max(1, CHUNK_COLUMNS // (oW * N))
    return [(r, min(r + rows, oH)) for r in range(0, oH, rows)]


def _gy_rows(gy):
    """gy (N, K, oH, oW) -> (K, oH*oW*N), the GEMM operand both gradients share."""
    return gy.transpose(1, 2, 3, 0).reshape(gy.shape[1], -1)   # (K, oH*oW*N)


# im2col and GEMM run over blocks of output rows: a block's columns (C*kH*kW x ~4096 floats) are
# still in cache when the GEMM reads them, and OpenBLAS runs a 6 x 25 x 25,088 product (LeNet's
# first conv) 4x faster as seven 3,584-column products than as one.
CHUNK_COLUMNS = 4096


def conv2d_fprop(plan, x, w, b=None, out=None):
    """x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW)."""
    N, K = x.shape[0], w.shape[0]
    oH, oW = plan.out_shape[2:]
    win, w2 = _windows(plan, x), w.reshape(K, -1)
    y = np.empty((K, oH, oW, N), dtype=np.result_type(x, w))
    for r0, r1 in _row_chunks(plan, N):
        cols = win[:, :, :, r0:r1].reshape(w2.shape[1], -1)            # (C*kH*kW, rows*oW*N)
        np.matmul(w2, cols, out=y[:, r0:r1].reshape(K, -1))
    if b is not None:
        y += b[:, None, None, None]
    y = y.transpose(3, 0, 1, 2)                                         # (N, K, oH, oW)
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
    g, w2t = _gy_rows(gy).reshape(K, oH, -1), w.reshape(K, -1).T
    gxp = np.zeros((C, H + t + b, W + l + r, N), dtype=gy.dtype)               # padded, CHWN
    for r0, r1 in _row_chunks(plan, N):
        gcols = (w2t @ g[:, r0:r1].reshape(K, -1)).reshape(C, kH, kW, r1 - r0, oW, N)
        # A loop over the kernel offsets only: each adds one whole strided slab.
        for i in range(kH):
            h0 = i * dh + r0 * sh
            for j in range(kW):
                gxp[:, h0:h0 + sh * (r1 - r0 - 1) + 1:sh, j * dw:j * dw + sw * (oW - 1) + 1:sw] += gcols[:, i, j]
    gx = gxp[:, t:t + H, l:l + W].transpose(3, 0, 1, 2)                         # (N, C, H, W)
    if out is None:
        return np.ascontiguousarray(gx)
    out[...] = gx
    return out


def conv2d_wgrad(plan, x, gy, gw, accumulate=True):
    """Adds dL/dw = gy @ im2col(x)^T into gw (K, C, kH, kW); accumulate=False overwrites gw."""
    K, oH = gy.shape[1], plan.out_shape[2]
    win, g = _windows(plan, x), _gy_rows(gy).reshape(K, oH, -1)
    dw = np.zeros((gw[0].size, K), dtype=gw.dtype)                     # (C*kH*kW, K)
    for r0, r1 in _row_chunks(plan, x.shape[0]):
        cols = win[:, :, :, r0:r1].reshape(dw.shape[0], -1)             # (C*kH*kW, rows*oW*N)
        # cols @ gy^T, then a transpose of the small result: OpenBLAS runs this orientation faster
        dw += cols @ g[:, r0:r1].reshape(K, -1).T
    dw = dw.T.reshape(gw.shape)                                         # (K, C, kH, kW)
    if accumulate:
        gw += dw
    else:
        gw[...] = dw
