"""Elementwise sum of several inputs (ResNet shortcuts)."""
import numpy as np


def add_fprop(xs, out=None):
    """y = x0 + x1 + ... (all the same shape)."""
    y = np.add(xs[0], xs[1], out=out)
    for x in xs[2:]:
        y += x
    return y
