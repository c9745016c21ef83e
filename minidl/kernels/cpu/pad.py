"""Constant padding of the spatial dimensions."""
from __future__ import annotations

import numpy as np

from ..._types import Array


def pad2d_fprop(x: Array, pads: tuple[int, int, int, int], value: float = 0.0, out: Array | None = None) -> Array:
    """x (N, C, H, W) -> (N, C, H+top+bottom, W+left+right), new cells = value."""
    t, b, l, r = pads
    N, C, H, W = x.shape
    if out is None:
        out = np.empty((N, C, H + t + b, W + l + r), dtype=x.dtype)
    out.fill(value)
    out[:, :, t:t + H, l:l + W] = x
    return out


def pad2d_bprop(gy: Array, pads: tuple[int, int, int, int], out: Array | None = None) -> Array:
    """gx = the centre of gy: padded cells carry no gradient."""
    t, b, l, r = pads
    centre = gy[:, :, t:gy.shape[2] - b, l:gy.shape[3] - r]
    if out is None:
        return centre.copy()
    out[...] = centre
    return out
