"""Batch normalisation over (N, H, W) per channel, as cuDNN's spatial mode computes it.

Under a precision policy x (and gy, y) may come in the compute dtype (float16, bfloat16) while the
parameters and statistics stay float32: the kernels then compute in float32 and round what they
return to x's dtype, so BN needs no casts around it (as the GPU family).
"""
from __future__ import annotations

import numpy as np

from ..._types import Array


def _c(v):
    return v[:, None, None]          # (C,) -> (C, 1, 1): broadcasts against (N, C, H, W)


def _count(x):
    """Values per channel, M = N*H*W; the unbiased variance needs M > 1."""
    M = x.size // x.shape[1]
    if M < 2:
        raise ValueError(f"batch norm in training needs more than one value per channel, got input {x.shape}")
    return M


def bn_fprop_train(x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array, momentum: float,
                   eps: float, out: Array | None = None, relu: bool = False) -> tuple[Array, Array, Array]:
    """Training forward with batch statistics, optionally followed by a ReLU.

    y = gamma (x - mean) / sqrt(var + eps) + beta (then max(y, 0) if relu).
    x (N, C, H, W) -> y, mean (C,), invstd (C,).
    Updates running_mean/var in place: r = (1 - momentum) r + momentum * batch, the variance
    unbiased (M/(M-1) var), as cuDNN and PyTorch; normalisation itself uses the biased variance.
    """
    if x.dtype != gamma.dtype:
        y, mean, invstd = bn_fprop_train(x.astype(gamma.dtype), gamma, beta, running_mean, running_var, momentum,
                                         eps, relu=relu)
        return _rounded(y, x.dtype, out), mean, invstd
    M = _count(x)
    mean = x.mean(axis=(0, 2, 3))
    xc = x - _c(mean)
    var = np.mean(xc * xc, axis=(0, 2, 3))     # two passes: no E[x^2] - E[x]^2 cancellation
    invstd = 1.0 / np.sqrt(var + eps)
    running_mean *= 1.0 - momentum
    running_mean += momentum * mean
    running_var *= 1.0 - momentum
    running_var += (momentum * M / (M - 1)) * var
    y = np.multiply(xc, _c(gamma * invstd), out=out)
    y += _c(beta)
    if relu:
        np.maximum(y, 0, out=y)
    return y, mean, invstd


def bn_fprop_infer(x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array, eps: float,
                   out: Array | None = None, relu: bool = False) -> Array:
    """y = gamma (x - running_mean) / sqrt(running_var + eps) + beta (then max(y, 0) if relu).   x -> y."""
    if x.dtype != gamma.dtype:
        y = bn_fprop_infer(x.astype(gamma.dtype), gamma, beta, running_mean, running_var, eps, relu=relu)
        return _rounded(y, x.dtype, out)
    scale = gamma / np.sqrt(running_var + eps)
    y = np.multiply(x, _c(scale), out=out)
    y += _c(beta - running_mean * scale)
    if relu:
        np.maximum(y, 0, out=y)
    return y


def bn_bprop(x: Array, gy: Array, gamma: Array, mean: Array, invstd: Array, ggamma: Array, gbeta: Array,
             out: Array | None = None, y: Array | None = None, relu: bool = False, accumulate: bool = True) -> Array:
    """Training backward through the batch statistics; adds into ggamma, gbeta (C,), or overwrites them.

    gx = gamma invstd (gy - mean(gy) - xhat mean(gy xhat)).   x, gy (N, C, H, W) -> gx (N, C, H, W).
    relu=True differentiates the fused BN + ReLU: gy is first masked by y > 0, y the fused output.
    """
    if relu:
        if y is None:
            raise ValueError("bn_bprop: relu=True needs y, the output of bn_fprop_train(..., relu=True)")
        gy = gy * (y > 0)
    if x.dtype != gamma.dtype:
        gx = bn_bprop(x.astype(gamma.dtype), gy.astype(gamma.dtype), gamma, mean, invstd, ggamma, gbeta,
                      accumulate=accumulate)
        return _rounded(gx, x.dtype, out)
    M = x.size // x.shape[1]
    xhat = (x - _c(mean)) * _c(invstd)
    gb = gy.sum(axis=(0, 2, 3))
    gg = (gy * xhat).sum(axis=(0, 2, 3))
    if accumulate:
        gbeta += gb
        ggamma += gg
    else:
        gbeta[...] = gb
        ggamma[...] = gg
    t = xhat * _c(gg / M)
    t += _c(gb / M)
    gx = np.subtract(gy, t, out=out)
    gx *= _c(gamma * invstd)
    return gx


def _rounded(a, dtype, out):
    """a rounded to dtype, into `out` when given."""
    if out is None:
        return a.astype(dtype)
    out[...] = a
    return out
