"""Merging layers on the GPU: the sum of two inputs (and its ReLU) is one elementwise kernel."""
from __future__ import annotations

from collections.abc import Sequence

import cupy as cp

from ..._types import Array
from ._dtypes import ELEMENTWISE
from ._util import ADD_RELU, RELU, channels_last, empty, pointwise

DTYPES = ELEMENTWISE     # CuPy's add and ElementwiseKernels on T


def add_fprop(xs: Sequence[Array], out: Array | None = None, relu: bool = False) -> Array:
    """y = sum of the arrays in xs (all of one shape), then max(y, 0) if relu."""
    if len(xs) == 1:
        if out is None:
            out = empty(xs[0].shape, xs[0].dtype, channels_last(xs[0]))
        cp.copyto(out, xs[0])
        return pointwise(RELU, out, out=out) if relu else out
    if len(xs) == 2 and relu:                   # the ResNet shortcut: one kernel
        return pointwise(ADD_RELU, xs[0], xs[1], out=out)
    rest = list(xs)
    if any(x is out for x in xs):               # accumulate into the aliased input, never read it overwritten
        del rest[next(i for i, x in enumerate(xs) if x is out)]
    else:
        out = pointwise(cp.add, rest.pop(0), rest.pop(0), out=out)
    for x in rest[:-1]:
        pointwise(cp.add, out, x, out=out)
    if rest and relu:                           # the last add applies the ReLU
        return pointwise(ADD_RELU, out, rest[-1], out=out)
    if rest:
        pointwise(cp.add, out, rest[-1], out=out)
    return pointwise(RELU, out, out=out) if relu else out
