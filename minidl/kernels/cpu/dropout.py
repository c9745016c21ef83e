"""Inverted dropout: kept values are scaled at training time so inference is the identity."""
import numpy as np


def dropout_fprop(x, rate, rng, out=None):
    """y = x * mask, mask = (u >= rate) / (1 - rate), u ~ U[0, 1).

    x (any shape) -> y, mask (x's shape and dtype).
    """
    # Generator.random draws float32 or float64 only; other dtypes take float64 draws.
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float64
    u = rng.random(x.shape, dtype=dtype)
    mask = np.where(u >= rate, x.dtype.type(1.0 / (1.0 - rate)), x.dtype.type(0.0))
    return np.multiply(x, mask, out=out), mask


def dropout_bprop(gy, mask, out=None):
    """gx = gy * mask.   gy, mask (same shape) -> gx."""
    return np.multiply(gy, mask, out=out)
