"""Across-channel local response normalisation, as cuDNN (cudnnLRNCrossChannelForward) and Caffe."""
from __future__ import annotations

import numpy as np

from ..._types import Array


def _reach(size):
    """(behind, ahead): cuDNN's window for channel c is [c - floor((size-1)/2), c + size - 1 - that]."""
    behind = (size - 1) // 2
    return behind, size - 1 - behind


def _window_sum(a, behind, ahead):
    """s[:, c] = sum of a[:, c+d] over d in [-behind, ahead] inside [0, C).   (N, C, H, W)."""
    C = a.shape[1]
    s = np.zeros_like(a)
    # A loop over the window offsets only: each adds a whole shifted slab of channels.
    for d in range(-behind, ahead + 1):
        if abs(d) >= C:
            continue
        if d >= 0:
            s[:, :C - d] += a[:, d:]
        else:
            s[:, -d:] += a[:, :C + d]
    return s


def lrn_fprop(x: Array, size: int, alpha: float, beta: float, k: float,
              out: Array | None = None) -> tuple[Array, Array]:
    """Across-channel LRN forward.

    scale = k + alpha/size * sum_window x^2;  y = x scale^-beta.   x (N, C, H, W) -> y, scale (N, C, H, W).
    """
    behind, ahead = _reach(size)
    scale = _window_sum(x * x, behind, ahead)
    scale *= alpha / size
    scale += k
    y = np.power(scale, -beta, out=out)
    y *= x
    return y, scale


def lrn_bprop(x: Array, y: Array, scale: Array, gy: Array, size: int, alpha: float, beta: float, k: float,
              out: Array | None = None) -> Array:
    """Across-channel LRN backward.

    gx_j = gy_j scale_j^-beta - 2 alpha beta/size x_j sum_{c: j in window(c)} gy_c y_c / scale_c.
    x, y, scale, gy (N, C, H, W) -> gx (N, C, H, W).
    """
    behind, ahead = _reach(size)
    # j lies in c's window [c - behind, c + ahead] exactly when c lies in [j - ahead, j + behind]:
    # the adjoint window is mirrored, which matters for even sizes.
    t = _window_sum(gy * y / scale, ahead, behind)
    t *= x
    t *= 2.0 * alpha * beta / size
    gx = np.power(scale, -beta, out=out)
    gx *= gy
    gx -= t
    return gx
