"""Dropout."""
from numbers import Real

from .base import ALL, Layer, record_config


class Dropout(Layer):
    """Training: y = x * mask, mask = Bernoulli(1 - rate) / (1 - rate); evaluation: y = x.   Any shape.

    Inverted dropout, so inference needs no rescaling. Masks are drawn from the device's seeded
    counter-based generator (`device.rng`), so a run is reproducible from the model's seed, a
    captured step draws a new mask at every replay, and a resumed run continues the same draws.
    """

    prefix, inference_identity, needs_rng = "dropout", True, True

    @record_config
    def __init__(self, rate=0.5, name=None):
        super().__init__(name)
        if not (isinstance(rate, Real) and 0.0 <= rate < 1.0):
            raise self.error(f"rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def build(self, in_shapes, device):
        shape, = in_shapes
        self.kern, = self.kernel_families(device, "dropout")
        self.rng = device.rng
        return tuple(shape)

    def forward(self, xs, training):
        x, = xs
        if not training:
            self.saved = None
            return x
        y, self.saved = self.kern.dropout_fprop(x, self.rate, self.rng)
        return y

    def backward(self, gy, need=ALL):
        mask = self.saved
        return (gy if mask is None else self.kern.dropout_bprop(gy, mask),)
