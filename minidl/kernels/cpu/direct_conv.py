"""Direct convolution, NumPy reference: stride-1 conv + bias (+ ReLU) (+ 2x2 max-pool).

minidl/kernels/gpu/direct_conv.py runs these as one hand-written CUDA kernel a conv stage; here
they are compositions of the reference conv and pool kernels, which the GPU kernel is tested
against. `supported_conv` says which shapes the GPU kernel takes (its limits below); the inference
planner asks it on both devices, so the CPU runs the very plan the GPU runs.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array
from . import conv as _conv, pool as _pool
from ._util import emit

# Limits of the GPU kernels (shared memory, registers, unrolled code size).
MAX_TAPS = 7            # kH, kW <= 7
MAX_PATCH = 64          # (kH + pool - 1) * (kW + pool - 1) registers per channel
MAX_CONV_W = 4096       # C * kH * kW (one output channel's weights)
MAX_IMAGE = 8192        # C * padded H * padded W floats of one sample in shared memory
MAX_K = 256


def pads4(pads: int | Sequence[int]) -> tuple[int, int, int, int]:
    """An int, a pair or a 4-sequence -> (top, bottom, left, right)."""
    if isinstance(pads, (int, np.integer)):
        return (int(pads),) * 4
    pads = tuple(int(p) for p in pads)
    if len(pads) == 2:
        return (pads[0], pads[0], pads[1], pads[1])
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"pads must be an int, a pair or (top, bottom, left, right) >= 0, got {pads}")
    return pads


def conv_geometry(x_shape: Sequence[int], w_shape: Sequence[int], pads: int | Sequence[int],
                  pool: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(conv output (oH, oW), pooled output (pH, pW)) of a stride-1 conv and a pool x pool floor pool."""
    C, H, W = x_shape[-3:]
    K, Cw, kH, kW = w_shape
    if Cw != C:
        raise ValueError(f"direct conv: weights {tuple(w_shape)} do not fit input channels {C}")
    t, b, l, r = pads4(pads)
    oH, oW = H + t + b - kH + 1, W + l + r - kW + 1
    if pool not in (1, 2):
        raise ValueError(f"direct conv: pool must be 1 or 2, got {pool}")
    pH, pW = oH // pool, oW // pool
    if min(pH, pW) <= 0:
        raise ValueError(f"direct conv: a {kH}x{kW} kernel and a {pool}x{pool} pool do not fit "
                         f"{(C, H, W)} with pads {(t, b, l, r)}")
    return (oH, oW), (pH, pW)


def supported_conv(x_shape: Sequence[int], w_shape: Sequence[int], pads: int | Sequence[int], pool: int) -> bool:
    """Whether the GPU direct conv kernel takes this stride-1 conv (+ pool x pool max-pool)."""
    try:
        (oH, oW), (pH, pW) = conv_geometry(x_shape, w_shape, pads, pool)
    except ValueError:
        return False
    C = x_shape[-3]
    K, _, kH, kW = w_shape
    rows, cols = pool * pH + kH - 1, pool * pW + kW - 1
    return (max(kH, kW) <= MAX_TAPS and (kH + pool - 1) * (kW + pool - 1) <= MAX_PATCH
            and C * kH * kW <= MAX_CONV_W and C * rows * (cols + 1) <= MAX_IMAGE and K <= MAX_K)



def conv2d_bias_relu_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0, relu: bool = True,
                           out: Array | None = None) -> Array:
    """y = relu(conv(x, w) + b), stride 1.   x (N, C, H, W), w (K, C, kH, kW), b (K,) -> (N, K, oH, oW)."""
    t, bo, l, r = pads4(pads)
    if (t, l) != (bo, r):                          # asymmetric: pad explicitly, then a valid conv
        x = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))
        t = l = 0
    plan = _conv.conv2d_plan(x.shape, w.shape, (1, 1), (t, l), (1, 1))
    y = _conv.conv2d_fprop(plan, x, w, b)
    if relu:
        np.maximum(y, 0, out=y)
    return emit(y, out)


def conv2d_bias_relu_maxpool2x2_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0,
                                      relu: bool = True, out: Array | None = None) -> Array:
    """y = maxpool2x2(relu(conv(x, w) + b)), stride-1 conv, floor pool.   -> (N, K, oH // 2, oW // 2)."""
    y = conv2d_bias_relu_fprop(x, w, b, pads, relu)
    plan = _pool.pool2d_plan(y.shape, 2, 2, 0)
    return emit(_pool.maxpool2d_fprop(plan, y), out)

