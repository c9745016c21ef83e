"""Shape arithmetic every backend's kernels share: plans made from shapes, the limits of the fused
inference kernels, and the filter layouts of the compute-dtype copies.

Backend-neutral (NumPy for integer maths only; no array is touched here but through the views and
the `copyto` a caller passes), so `kernels/cpu` and `kernels/gpu` plan alike and neither imports the
other: the inference planner asks `supported_conv`/`supported_chain` on every device, so the CPU runs
the very plan the GPU runs. Padding specs are resolved in `minidl/padding.py`, which Conv2D also reads.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..padding import out_size, pads4, resolve_pads
from .._types import Array

__all__ = ["ConvPlan", "MAX_CHAIN_SMEM", "MAX_CONV_W", "MAX_IMAGE", "MAX_K", "MAX_PATCH", "MAX_TAPS", "MAX_WIDTH",
           "PoolPlan", "cast_filters", "conv2d_plan", "conv_geometry", "filter_view", "out_size", "pads4",
           "pool2d_plan", "resolve_pads", "supported_chain", "supported_conv"]


# -- convolution and pooling plans ------------------------------------------------------------------
@dataclass(frozen=True)
class ConvPlan:
    in_shape: tuple      # (N, C, H, W), N may be None
    w_shape: tuple       # (K, C, kH, kW)
    out_shape: tuple     # (N, K, oH, oW)
    pads: tuple          # (top, bottom, left, right)
    stride: tuple
    dilation: tuple
    ws: dict = field(default_factory=dict, compare=False, repr=False)   # the CPU kernels' buffers


def conv2d_plan(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                padding: int | str | Sequence[int], dilation: Sequence[int]) -> ConvPlan:
    """The plan of a convolution of x (N, C, H, W) by w (K, C, kH, kW): pads and output shape."""
    N, C, H, W = x_shape
    K, _, kH, kW = w_shape
    pads = resolve_pads(padding, (H, W), (kH, kW), stride, dilation)
    oH = out_size(H, kH, stride[0], dilation[0], pads[0], pads[1])
    oW = out_size(W, kW, stride[1], dilation[1], pads[2], pads[3])
    if oH <= 0 or oW <= 0:
        raise ValueError(f"a {kH}x{kW} kernel (dilation {dilation}) does not fit a {H}x{W} input "
                         f"with padding {pads}")
    return ConvPlan(tuple(x_shape), tuple(w_shape), (N, K, oH, oW), pads, tuple(stride), tuple(dilation))


@dataclass(frozen=True)
class PoolPlan:
    in_shape: tuple      # (N, C, H, W), N may be None
    out_shape: tuple     # (N, C, oH, oW)
    pads: tuple          # (top, bottom, left, right)
    ksize: tuple         # (kH, kW)
    stride: tuple        # (sH, sW)


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(s) for s in v)


def pool2d_plan(x_shape: Sequence[int], ksize: int | Sequence[int], stride: int | Sequence[int],
                padding: int | str | Sequence[int]) -> PoolPlan:
    """Plan a kH x kW pooling window; padding is an int, a pair, 'same' or 'valid'."""
    N, C, H, W = x_shape
    (kH, kW), (sH, sW) = _pair(ksize), _pair(stride)
    if min(kH, kW, sH, sW) <= 0:
        raise ValueError(f"window {(kH, kW)} and stride {(sH, sW)} must be positive")
    t, b, l, r = pads = resolve_pads(padding, (H, W), (kH, kW), (sH, sW), (1, 1))
    # At most half a window of padding (PyTorch's rule) keeps a real cell in every window,
    # so a max never comes from padding alone.
    if 2 * max(t, b) > kH or 2 * max(l, r) > kW:
        raise ValueError(f"padding {pads} is more than half the {kH}x{kW} window")
    oH, oW = out_size(H, kH, sH, 1, t, b), out_size(W, kW, sW, 1, l, r)
    if oH <= 0 or oW <= 0:
        raise ValueError(f"a {kH}x{kW} window does not fit a {H}x{W} input with padding {pads}")
    return PoolPlan(tuple(x_shape), (N, C, oH, oW), pads, (kH, kW), (sH, sW))


# -- the direct family's limits (the GPU's hand-written kernels: shared memory, registers, code size) --
MAX_TAPS = 7            # kH, kW <= 7
MAX_PATCH = 64          # (kH + pool - 1) * (kW + pool - 1) registers per channel
MAX_CONV_W = 4096       # C * kH * kW (one output channel's weights)
MAX_IMAGE = 8192        # C * padded H * padded W floats of one sample in shared memory
MAX_K = 256
MAX_WIDTH = 4096        # the chain kernel's dense widths
MAX_CHAIN_SMEM = 40 * 1024   # floats of one sample's activations in the chain kernel's shared memory


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


# -- filter layouts (graph/arena.py: a channels-last convolution's compute-dtype filters) -------------
def filter_view(a: Array, shape: Sequence[int], krsc: bool) -> Array:
    """The 1-D range `a` as a (K, C, kH, kW) array: C-contiguous, or lying K, kH, kW, C if krsc (the
    compute-dtype copies of a channels-last convolution's filters, graph/arena.py)."""
    K, C, kh, kw = shape
    return a.reshape(K, kh, kw, C).transpose(0, 3, 1, 2) if krsc else a.reshape(shape)


def cast_filters(dst: Array, src: Array, filters: Iterable[Sequence[int]], to_krsc: bool,
                 copyto: Callable[..., Any] = np.copyto) -> None:
    """Each filter range cast-copied from src's layout into dst's, one copy a filter (the GPU's fallback
    too, with CuPy's copyto)."""
    for o, *shape in filters:
        n = int(np.prod(shape))
        copyto(filter_view(dst[o:o + n], shape, to_krsc), filter_view(src[o:o + n], shape, not to_krsc),
               casting="unsafe")
