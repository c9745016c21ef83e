"""Fully connected layer and the bias gradient shared by conv and dense."""
import numpy as np


def dense_fprop(x, w, b=None, out=None):
    """x (N, C), w (K, C), b (K,) -> y = x w^T + b (N, K)."""
    y = np.matmul(x, w.T, out=out)
    if b is not None:
        y += b
    return y


def dense_dgrad(gy, w, out=None):
    """gy (N, K), w (K, C) -> gx (N, C)."""
    return np.matmul(gy, w, out=out)


def dense_wgrad(x, gy, gw):
    """Adds gy^T x into gw (K, C)."""
    gw += gy.T @ x


def bias_grad(gy, gb):
    """Adds gy summed over every axis but 1 into gb."""
    gb += gy.sum(axis=tuple(i for i in range(gy.ndim) if i != 1))
