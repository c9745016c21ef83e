"""Dense chains and their elementwise epilogues, NumPy reference (minidl/kernels/gpu/mlp.py on the GPU)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array
from ._util import emit


def mlp_fprop(x: Array, ws: Sequence[Array], bs: Sequence[Array | None], relus: Sequence[bool],
              out: Array | None = None) -> Array:
    """A chain of dense layers: h = x; h = relu?(h @ w.T + b) for each (w, b, relu).   x (N, D0) -> (N, DL)."""
    h = x.reshape(x.shape[0], -1)
    for w, b, relu in zip(ws, bs, relus):
        h = h @ w.T
        if b is not None:
            h += b
        if relu:
            np.maximum(h, 0, out=h)
    return emit(h, out)


def add_relu_fprop(xs: Sequence[Array], out: Array | None = None) -> Array:
    """y = max(sum of xs, 0)."""
    y = xs[0] + xs[1] if len(xs) > 1 else xs[0].copy()
    for x in xs[2:]:
        y += x
    return emit(np.maximum(y, 0, out=y), out)


def bias_act_fprop(y: Array, b: Array | None, relu: bool, out: Array | None = None) -> Array:
    """y + b (b broadcast over rows), then max(., 0) if relu."""
    z = y + b if b is not None else y.copy()
    if relu:
        np.maximum(z, 0, out=z)
    return emit(z, out)
