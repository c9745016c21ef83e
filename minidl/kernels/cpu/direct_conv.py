"""Direct convolution, NumPy reference: stride-1 conv + bias (+ ReLU) (+ 2x2 max-pool).

minidl/kernels/gpu/direct_conv.py runs these as one hand-written CUDA kernel a conv stage; here
they are compositions of the reference conv and pool kernels, which the GPU kernel is tested
against. `supported_conv` says which shapes the GPU kernel takes (its limits in kernels/shapes.py); the inference
planner asks it on both devices, so the CPU runs the very plan the GPU runs.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array
from ..shapes import conv_geometry, pads4, supported_conv  # noqa: F401  the family's: one definition
from . import conv as _conv, pool as _pool
from ._util import emit


def conv2d_bias_relu_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0, relu: bool = True,
                           out: Array | None = None, config: Sequence[int] | None = None) -> Array:
    """y = relu(conv(x, w) + b), stride 1.   x (N, C, H, W), w (K, C, kH, kW), b (K,) -> (N, K, oH, oW).
    `config` (the GPU kernel's launch choice) is ignored here."""
    t, bo, l, r = pads4(pads)
    if (t, l) != (bo, r):                          # asymmetric: pad explicitly, then a valid conv
        x = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))
        t = l = 0
    plan = _conv.conv2d_plan(x.shape, w.shape, (1, 1), (t, l), (1, 1))
    y = _conv.conv2d_fprop(plan, x, w, b)
    if relu:
        np.maximum(y, 0, out=y)
    return emit(y, out)


def affine(x: Array, x_affine: tuple[Array, Array] | None) -> Array:
    """x, or a x + b per channel (a Normalize the direct kernels apply as they read x)."""
    if x_affine is None:
        return x
    a, b = (v.reshape((-1,) + (1,) * (x.ndim - 2)) for v in x_affine)
    return (x * a + b).astype(x.dtype, copy=False)


def conv2d_bias_relu_maxpool2x2_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0,
                                      relu: bool = True, out: Array | None = None,
                                      config: Sequence[int] | None = None,
                                      x_affine: tuple[Array, Array] | None = None) -> Array:
    """y = maxpool2x2(relu(conv(x', w) + b)), stride-1 conv, floor pool.   -> (N, K, oH // 2, oW // 2).
    x' = x, or a x + b per channel with x_affine = (a, b) (C,), before the zero padding."""
    y = conv2d_bias_relu_fprop(affine(x, x_affine), w, b, pads, relu)
    plan = _pool.pool2d_plan(y.shape, 2, 2, 0)
    return emit(_pool.maxpool2d_fprop(plan, y), out)

