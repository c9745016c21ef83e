"""A whole small network as one call ("chain"), NumPy reference: conv stages, a flatten, dense stages.

minidl/kernels/gpu/chain.py runs it as ONE CUDA kernel; `supported_chain` says which stages that
kernel takes (shared memory holds one sample's activations and the conv weights).

`stages` is a list of ("conv", w, b, pads, pool, relu) (pool 1 or 2) and ("dense", w, b, relu)
tuples: the conv stages first, then (after an implicit flatten) one or more dense ones.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array
from ._util import emit
from .direct_conv import (conv2d_bias_relu_fprop, conv2d_bias_relu_maxpool2x2_fprop, conv_geometry, pads4,
                          supported_conv)
from .mlp import mlp_fprop

# Limits of the GPU chain kernel (besides those of its conv stages, in direct_conv.py).
MAX_WIDTH = 4096        # dense widths
MAX_CHAIN_SMEM = 40 * 1024   # floats of one sample's activations in shared memory


def supported_chain(x_shape: Sequence[int], stages: Sequence[tuple]) -> bool:
    """Whether the GPU chain kernel takes these stages for inputs of per-sample shape x_shape: conv
    stages (their weights staged in shared memory), then one or more dense stages."""
    shape, floats, seen_dense = tuple(x_shape), 0, False
    for i, st in enumerate(stages):
        if st[0] == "conv":
            _, w, _, pads, pool, _ = st
            if seen_dense or len(shape) != 3 or not supported_conv(shape, w.shape, pads, pool) or w.shape[0] > 64:
                return False
            if i == 0:                                  # the zero-padded copy of the input
                t, b, l, r = pads4(pads)
                floats += shape[0] * (shape[1] + t + b) * (shape[2] + l + r + 1)
            _, (pH, pW) = conv_geometry(shape, w.shape, pads, pool)
            floats += int(np.prod(w.shape[1:])) * (-(-w.shape[0] // 4) * 4)
            shape = (w.shape[0], pH, pW)
        elif st[0] == "dense":
            w = st[1]
            n = int(np.prod(shape))
            if w.ndim != 2 or w.shape[1] != n or max(w.shape) > MAX_WIDTH:
                return False
            shape, seen_dense = (w.shape[0],), True
        else:
            return False
        floats += int(np.prod(shape)) + 4
    return seen_dense and floats + int(np.prod(x_shape)) <= MAX_CHAIN_SMEM


def chain_fprop(x: Array, stages: Sequence[tuple], out: Array | None = None) -> Array:
    """conv stages, a flatten, dense stages (stages: see the module docstring).   x (N, ...) -> (N, D)."""
    h = x
    for st in stages:
        if st[0] == "conv":
            _, w, b, pads, pool, relu = st
            f = conv2d_bias_relu_maxpool2x2_fprop if pool == 2 else conv2d_bias_relu_fprop
            h = f(h, w, b, pads, relu)
        else:
            _, w, b, relu = st
            h = mlp_fprop(h, [w], [b], [relu])
    return emit(h, out)
