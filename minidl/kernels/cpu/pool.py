"""2-D max and average pooling and global average pooling (NCHW; floor output size, as cuDNN)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array
from ..shapes import PoolPlan, pool2d_plan  # noqa: F401  the family's plans: one definition
from ._util import emit, like


def _pad(x, pads, value):
    t, b, l, r = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)


def _slabs(plan):
    """For each window offset (i, j), row-major: the index of the strided slab (N, C, oH, oW)
    of a padded array that offset reads in every window."""
    (kH, kW), (sH, sW) = plan.ksize, plan.stride
    oH, oW = plan.out_shape[2:]
    for i in range(kH):
        for j in range(kW):
            yield np.s_[:, :, i:i + sH * oH:sH, j:j + sW * oW:sW]


def _emit(a, out):
    if out is None:
        return np.ascontiguousarray(a)
    out[...] = a
    return out


def _crop(plan, gxp):
    t, _, l, _ = plan.pads
    H, W = plan.in_shape[2:]
    return gxp[:, :, t:t + H, l:l + W]


def maxpool2d_fprop(plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
    """x (N, C, H, W) -> y (N, C, oH, oW): the max of each window, padding read as -inf."""
    xp = _pad(x, plan.pads, -np.inf)
    slabs = list(_slabs(plan))
    if len(slabs) == 1:
        return _emit(xp[slabs[0]], out)
    # A loop over the kH*kW window offsets only: each folds a whole strided slab into y.
    y = np.maximum(xp[slabs[0]], xp[slabs[1]], out=out)
    for s in slabs[2:]:
        np.maximum(y, xp[s], out=y)
    return y


def maxpool2d_bprop(plan: PoolPlan, x: Array, y: Array, gy: Array, out: Array | None = None) -> Array:
    """x (N, C, H, W), y and gy (N, C, oH, oW) -> gx: each gy to the first max of its window."""
    xp, gy = _pad(x, plan.pads, -np.inf), like(gy, y)      # every operand in one memory order
    (kH, kW), (sH, sW) = plan.ksize, plan.stride
    # Disjoint windows write each input cell once: the gradient is stored, not added; windows that
    # also tile the whole (padded) input leave no cell unwritten, so nothing needs zeroing first.
    disjoint = sH >= kH and sW >= kW
    tiled = (sH, sW) == (kH, kW) and xp.shape[2:] == (kH * y.shape[2], kW * y.shape[3])
    gxp = (np.empty_like if tiled else np.zeros_like)(xp, dtype=gy.dtype)
    hit, free = np.empty_like(y, dtype=bool), np.empty_like(y, dtype=bool)
    g = None if disjoint else np.empty_like(y, dtype=gy.dtype)
    slabs = list(_slabs(plan))
    last = len(slabs) - 1
    # Offsets in row-major order and `free` (windows whose max has not been routed yet) send each
    # gradient to the first max only (ties as PyTorch and deterministic cuDNN).
    for k, s in enumerate(slabs):
        if k == 0:
            np.equal(xp[s], y, out=hit)
            np.logical_not(hit, out=free)
        elif k < last:
            np.equal(xp[s], y, out=hit)
            hit &= free
            free ^= hit                      # hit is within free: this clears the routed windows
        else:
            hit = free                       # y is each window's max: those left have it here
        if disjoint:
            np.multiply(gy, hit, out=gxp[s])
        else:                                # overlapping windows accumulate
            gxp[s] += np.multiply(gy, hit, out=g)
    return emit(_crop(plan, gxp), out)     # gxp is ours: a crop of it needs no copy


def avgpool2d_fprop(plan: PoolPlan, x: Array, out: Array | None = None) -> Array:
    """x (N, C, H, W) -> y (N, C, oH, oW) = window sum / (kH kW), padding counted as zeros."""
    xp = _pad(x, plan.pads, 0)
    y = None
    for s in _slabs(plan):
        y = xp[s].copy() if y is None else np.add(y, xp[s], out=y)
    y *= 1.0 / (plan.ksize[0] * plan.ksize[1])
    return _emit(y, out)


def avgpool2d_bprop(plan: PoolPlan, gy: Array, out: Array | None = None) -> Array:
    """gy (N, C, oH, oW) -> gx (N, C, H, W): gy / (kH kW) spread over each window."""
    N, C = gy.shape[:2]
    t, b, l, r = plan.pads
    H, W = plan.in_shape[2:]
    g = gy * (1.0 / (plan.ksize[0] * plan.ksize[1]))
    gxp = np.zeros((N, C, H + t + b, W + l + r), dtype=gy.dtype)
    for s in _slabs(plan):
        gxp[s] += g
    return _emit(_crop(plan, gxp), out)


def global_avgpool_fprop(x: Array, out: Array | None = None) -> Array:
    """x (N, C, H, W) -> y (N, C, 1, 1) = mean over H, W."""
    return np.mean(x, axis=(2, 3), keepdims=True, out=out)


def global_avgpool_bprop(gy: Array, x_shape: Sequence[int], out: Array | None = None) -> Array:
    """gy (N, C, 1, 1) -> gx (N, C, H, W) = gy / (H W) at every pixel."""
    H, W = x_shape[2:]
    if out is None:
        out = np.empty(tuple(x_shape), dtype=gy.dtype)
    out[...] = gy * (1.0 / (H * W))
    return out
