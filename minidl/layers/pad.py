"""Pad2D: constant padding of height and width."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract


class Pad2D(Layer):
    """y = x surrounded by `value`.  x (N, C, H, W) -> (N, C, H+top+bottom, W+left+right).

    padding: an int (all sides), a pair (pH, pW), or (top, bottom, left, right).
    """

    prefix = "pad"

    @record_config
    def __init__(self, padding: int | Sequence[int], value: float = 0.0, name: str | None = None) -> None:
        super().__init__(name)
        p = (padding,) if not isinstance(padding, (tuple, list)) else tuple(padding)
        if len(p) not in (1, 2, 4) or not all(isinstance(v, int) for v in p):
            raise self.error(f"padding must be an int, a pair or (top, bottom, left, right), got {padding!r}")
        if min(p) < 0:
            raise self.error(f"padding must be non-negative, got {padding!r}")
        self.pads = p * 4 if len(p) == 1 else (p[0], p[0], p[1], p[1]) if len(p) == 2 else p
        self.value = float(value)

    kern: contract.Pad                  # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.expect_rank(shape, 4)
        t, b, l, r = self.pads
        self.kern, = self.kernel_families(device, "pad")
        N, C, H, W = shape
        return (N, C, H + t + b, W + l + r)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        return self.kern.pad2d_fprop(x, self.pads, self.value)

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.kern.pad2d_bprop(gy, self.pads),)

    def fold_into_consumer(self, consumer: Layer, in_shape: tuple[int, ...]) -> Layer | None:
        """A zero pad read only by a conv becomes that conv's padding (ResNet's strided convs)."""
        if self.value != 0 or consumer.kind != "conv2d":
            return None
        C, H, W = in_shape
        t, b, l, r = self.pads
        own = consumer.pads((C, H + t + b, W + l + r))  # type: ignore[attr-defined]  # a Conv2D (its kind)
        return consumer.clone(padding=[p + q for p, q in zip(self.pads, own)])
