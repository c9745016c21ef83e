"""Softmax over the class axis."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract


class Softmax(Layer):
    """y_k = exp(x_k) / sum_j exp(x_j) over axis 1.   x (N, K) -> y (N, K).

    Trainers take the cross-entropy from this layer's input (the logits) rather than from its
    rounded output: the training lowering drops a final Softmax and the loss reads logits.
    """

    prefix = "softmax"
    keeps_fp32 = True          # exp and its normalising sum in float32 under any precision policy

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    kern: contract.Softmax              # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        if len(shape) != 2:
            raise self.error(f"expects a 2-D input (N, classes), got shape {shape}")
        self.kern, = self.kernel_families(device, "softmax")
        return shape

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        self.saved = y = self.kern.softmax_fprop(x)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.kern.softmax_bprop(self.saved, gy),)
