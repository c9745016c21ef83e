"""Elementwise sum of several inputs (ResNet shortcuts), optionally followed by a ReLU."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..._types import Array


def add_fprop(xs: Sequence[Array], out: Array | None = None, relu: bool = False) -> Array:
    """y = x0 + x1 + ... (all the same shape), then max(y, 0) if relu."""
    rest = list(xs)
    if any(x is out for x in xs):               # accumulate into the aliased input, never read it overwritten
        del rest[next(i for i, x in enumerate(xs) if x is out)]
        y: Array = out
    elif len(rest) == 1:
        y = np.empty_like(rest[0]) if out is None else out
        np.copyto(y, rest.pop())
    else:
        y = np.add(rest.pop(0), rest.pop(0), out=out)
    for x in rest:
        y += x
    if relu:
        np.maximum(y, 0, out=y)
    return y
