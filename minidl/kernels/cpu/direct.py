"""Fused inference kernels ("direct" family), NumPy reference: compositions of the CPU kernels.

`minidl/kernels/gpu/direct.py` implements the same functions as hand-written CUDA kernels for the
small shapes where cuDNN and one-kernel-per-op execution are slow (LeNet-5: a 1->6 channel 5x5
conv takes cuDNN ~100 us at batch 1000; at batch 1 launches dominate). Here each function is
the plain composition of the reference kernels, so the GPU kernels are tested against it.

    conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads=0, relu=True, out=None)
        y = maxpool2x2(relu(conv(x, w) + b)): stride 1, no dilation, a 2x2 stride-2 floor pool.
    conv2d_bias_relu_fprop(x, w, b, pads=0, relu=True, out=None)          the same, no pool
    mlp_fprop(x, ws, bs, relus, out=None)                                  a chain of dense layers
    chain_fprop(x, stages, out=None)                                       conv stages, flatten, dense chain
    add_relu_fprop(xs, out=None)                                           max(sum of xs, 0)
    bias_act_fprop(y, b, relu, out=None)                                   y + b (per column), then ReLU

`stages` is a list of ("conv", w, b, pads, pool, relu) (pool 1 or 2) and ("dense", w, b, relu)
tuples: the conv stages first, then (after an implicit flatten) one or more dense ones.
`supported_conv(...)` and `supported_chain(...)` say which shapes the GPU kernels take; the
inference planner asks them on both devices, so the CPU runs the very plan the GPU runs.
"""
import numpy as np

from . import conv as _conv, pool as _pool

# Limits of the GPU kernels (shared memory, registers, unrolled code size).
MAX_TAPS = 7            # kH, kW <= 7
MAX_PATCH = 64          # (kH + pool - 1) * (kW + pool - 1) registers per channel
MAX_CONV_W = 4096       # C * kH * kW (one output channel's weights)
MAX_IMAGE = 8192        # C * padded H * padded W floats of one sample in shared memory
MAX_K = 256
MAX_WIDTH = 4096        # dense widths in the chain kernel
MAX_CHAIN_SMEM = 40 * 1024   # floats of one sample's activations in the chain kernel


def pads4(pads):
    """An int, a pair or a 4-sequence -> (top, bottom, left, right)."""
    if isinstance(pads, (int, np.integer)):
        return (int(pads),) * 4
    pads = tuple(int(p) for p in pads)
    if len(pads) == 2:
        return (pads[0], pads[0], pads[1], pads[1])
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"pads must be an int, a pair or (top, bottom, left, right) >= 0, got {pads}")
    return pads


def conv_geometry(x_shape, w_shape, pads, pool):
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


def supported_conv(x_shape, w_shape, pads, pool):
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


def supported_chain(x_shape, stages):
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


def conv2d_bias_relu_fprop(x, w, b, pads=0, relu=True, out=None):
    """y = relu(conv(x, w) + b), stride 1.   x (N, C, H, W), w (K, C, kH, kW), b (K,) -> (N, K, oH, oW)."""
    t, bo, l, r = pads4(pads)
    if (t, l) != (bo, r):                          # asymmetric: pad explicitly, then a valid conv
        x = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))
        t = l = 0
    plan = _conv.conv2d_plan(x.shape, w.shape, (1, 1), (t, l), (1, 1))
    y = _conv.conv2d_fprop(plan, x, w, b)
    if relu:
        np.maximum(y, 0, out=y)
    return _emit(y, out)


def conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads=0, relu=True, out=None):
    """y = maxpool2x2(relu(conv(x, w) + b)), stride-1 conv, floor pool.   -> (N, K, oH // 2, oW // 2)."""
    y = conv2d_bias_relu_fprop(x, w, b, pads, relu)
    plan = _pool.pool2d_plan(y.shape, 2, 2, 0)
    return _emit(_pool.maxpool2d_fprop(plan, y), out)


def mlp_fprop(x, ws, bs, relus, out=None):
    """A chain of dense layers: h = x; h = relu?(h @ w.T + b) for each (w, b, relu).   x (N, D0) -> (N, DL)."""
    h = x.reshape(x.shape[0], -1)
    for w, b, relu in zip(ws, bs, relus):
        h = h @ w.T
        if b is not None:
            h += b
        if relu:
            np.maximum(h, 0, out=h)
    return _emit(h, out)


def chain_fprop(x, stages, out=None):
    """conv stages, a flatten, dense stages (see the module docstring).   x (N, ...) -> (N, D)."""
    h = x
    for st in stages:
        if st[0] == "conv":
            _, w, b, pads, pool, relu = st
            f = conv2d_bias_relu_maxpool2x2_fprop if pool == 2 else conv2d_bias_relu_fprop
            h = f(h, w, b, pads, relu)
        else:
            _, w, b, relu = st
            h = mlp_fprop(h, [w], [b], [relu])
    return _emit(h, out)


def add_relu_fprop(xs, out=None):
    """y = max(sum of xs, 0)."""
    y = xs[0] + xs[1] if len(xs) > 1 else xs[0].copy()
    for x in xs[2:]:
        y += x
    return _emit(np.maximum(y, 0, out=y), out)


def bias_act_fprop(y, b, relu, out=None):
    """y + b (b broadcast over rows), then max(., 0) if relu."""
    z = y + b if b is not None else y.copy()
    if relu:
        np.maximum(z, 0, out=z)
    return _emit(z, out)


def _emit(y, out):
    if out is None:
        return y
    out[...] = y
    return out
