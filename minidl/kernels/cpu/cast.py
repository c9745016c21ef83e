"""Casting kernels (NumPy reference): the compute-dtype copies of the master weights and their
gradients (graph/arena.py), rounded to nearest even; a channels-last convolution's filters permuted
to K, kH, kW, C on the way down and back on the way up (kernels/shapes.py: filter_view, cast_filters).
"""
from __future__ import annotations

import numpy as np

from ..._types import Array
from ..shapes import cast_filters, filter_view  # noqa: F401  (filter_view: the family's, on both sides)


def cast_copy(dst: Array, src: Array) -> None:
    """dst[...] = src rounded to dst's dtype (to nearest even): the compute-dtype copies of the master
    weights.   dst, src (P,)."""
    np.copyto(dst, src, casting="unsafe")


def cast_copy_where(dst: Array, src: Array, mask: Array) -> None:
    """dst[i] = src[i] as dst's dtype where mask[i]; elsewhere dst is left alone: the copies' gradients
    into the master's gradient arena.   dst, src, mask (P,)."""
    np.copyto(dst, src, casting="unsafe", where=mask)


def cast_filters_krsc(dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
    """The (K, C, kH, kW) filters at `filters` ((offset, K, C, kH, kW) each) of the master arena `src`
    into the copies' arena `dst`, each permuted to K, kH, kW, C within its range.   dst, src (P,)."""
    cast_filters(dst, src, filters, to_krsc=True)


def cast_filters_kcrs(dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
    """The inverse: the copies' K, kH, kW, C filters at `filters` into the master arena `dst` as
    (K, C, kH, kW).   dst, src (P,)."""
    cast_filters(dst, src, filters, to_krsc=False)
