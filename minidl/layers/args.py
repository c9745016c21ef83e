"""Argument helpers the layer families share: ints or pairs of ints, a weight's fans, a shape in words."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Refuses(Protocol):
    """What an argument check needs of the layer it checks for: its one error naming it (Layer.error).
    Said here, so that the helpers stand under the Layer contract (base.py imports them) and not beside it."""

    def error(self, message: str) -> Exception: ...


def _fans(shape):
    """(fan_in, fan_out) for a dense (K, C) or conv (K, C, kH, kW) weight."""
    if len(shape) < 2:
        return (shape[0] if shape else 1,) * 2
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


def _fmt(shape):
    return "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"


def pair(v: int | Sequence[int], what: str = "value") -> tuple[int, int]:
    """An int or a 2-sequence as a pair of ints."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    t = tuple(int(x) for x in v)
    if len(t) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {v!r}")
    return t


def positive_pair(layer: Refuses, v: int | Sequence[int], what: str) -> tuple[int, int]:
    try:
        p = pair(v, what)
    except (TypeError, ValueError):
        raise layer.error(f"{what} must be an int or a pair of ints, got {v!r}") from None
    if min(p) <= 0:
        raise layer.error(f"{what} must be positive, got {v!r}")
    return p
