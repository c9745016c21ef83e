"""Dropout."""
from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract


class Dropout(Layer):
    """Training: y = x * mask, mask = Bernoulli(1 - rate) / (1 - rate); evaluation: y = x.   Any shape.

    Inverted dropout, so inference needs no rescaling. Masks are drawn from the device's seeded
    counter-based generator (`device.rng`), so a run is reproducible from the model's seed, a
    captured step draws a new mask at every replay, and a resumed run continues the same draws.
    """

    prefix, inference_identity, needs_rng = "dropout", True, True

    @record_config
    def __init__(self, rate: float = 0.5, name: str | None = None) -> None:
        super().__init__(name)
        if not (isinstance(rate, Real) and 0.0 <= rate < 1.0):
            raise self.error(f"rate must be in [0, 1), got {rate!r}")
        self.rate: float = float(rate)

    kern: contract.Dropout              # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.kern, = self.kernel_families(device, "dropout")
        self.rng = device.rng
        return tuple(shape)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        if not training:
            self.saved = None
            return x
        y, self.saved = self.kern.dropout_fprop(x, self.rate, self.rng)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        mask = self.saved
        return (gy if mask is None else self.kern.dropout_bprop(gy, mask),)
