"""Padding arguments as numbers: what a layer and every backend's kernels compute from the same spec.

A layer's `padding` is an int, a pair (pH, pW), (top, bottom, left, right), 'same' or 'valid';
`resolve_pads` turns it into (top, bottom, left, right) and `out_size` gives the output length it
leaves. Conv2D asks before any device exists (a zero pad folds into the conv after it on the host);
the kernels' plans (kernels/shapes.py) ask at build. NumPy only, no other minidl module.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def resolve_pads(padding: int | str | Sequence[int], size: Sequence[int], ksize: Sequence[int], stride: Sequence[int],
                 dilation: Sequence[int]) -> tuple[int, ...]:
    """Padding spec -> (top, bottom, left, right); 'same' pads as TensorFlow (extra at the end)."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        pads: Any = []                # a list here, the name a 4-tuple below
        for n, k, s, d in zip(size, ksize, stride, dilation):
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    if isinstance(padding, str):
        raise ValueError(f"unknown padding {padding!r}: expected an int, a pair, 'same' or 'valid'")
    if not isinstance(padding, (int, np.integer)) and len(padding) == 4:
        pads = tuple(int(p) for p in padding)                # (top, bottom, left, right)
        if min(pads) < 0:
            raise ValueError(f"padding must be non-negative, got {padding!r}")
        return pads
    ph, pw = (padding, padding) if isinstance(padding, (int, np.integer)) else tuple(padding)
    if min(ph, pw) < 0:
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    return (int(ph), int(ph), int(pw), int(pw))


def out_size(n: int, k: int, s: int, d: int, p0: int, p1: int) -> int:
    """The output length of a window k (dilation d, stride s) over n values padded by p0 and p1."""
    return (n + p0 + p1 - (k - 1) * d - 1) // s + 1


def pads4(pads: int | Sequence[int]) -> tuple[int, int, int, int]:
    """An int, a pair or a 4-sequence -> (top, bottom, left, right)."""
    if isinstance(pads, (int, np.integer)):
        return (int(pads),) * 4
    pads = tuple(int(p) for p in pads)
    if len(pads) == 2:
        return (pads[0], pads[0], pads[1], pads[1])
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"pads must be an int, a pair or (top, bottom, left, right) >= 0, got {pads}")
    return pads
