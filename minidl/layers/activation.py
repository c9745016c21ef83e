"""Elementwise activations: ReLU, LeakyReLU, Sigmoid, Tanh."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device


class _Activation(Layer):
    """Shape-preserving elementwise layer; subclasses name the kernel pair and what backward needs."""

    kernel: str | None = None  # "relu" -> relu_fprop / relu_bprop
    needs_input = False      # backward reads x (else y)

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        act, = self.kernel_families(device, "activation")
        self.fprop, self.bprop = getattr(act, f"{self.kernel}_fprop"), getattr(act, f"{self.kernel}_bprop")
        return shape

    def extra(self) -> tuple[float, ...]:
        return ()

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        y = self.fprop(x, *self.extra())
        self.saved = x if self.needs_input else y
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.bprop(self.saved, gy, *self.extra()),)


class ReLU(_Activation):
    """y = max(x, 0).  The fusion pass lets the layer before apply it where that layer can."""
    prefix, kernel, fusable_activation = "relu", "relu", "relu"

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)


class LeakyReLU(_Activation):
    """y = x if x > 0 else alpha x."""
    prefix, kernel, needs_input = "leaky_relu", "leaky_relu", True

    @record_config
    def __init__(self, alpha: float = 0.01, name: str | None = None) -> None:
        super().__init__(name)
        if not alpha >= 0:
            raise self.error(f"alpha must be non-negative, got {alpha!r}")
        self.alpha = float(alpha)

    def extra(self) -> tuple[float, ...]:
        return (self.alpha,)


class Sigmoid(_Activation):
    """y = 1 / (1 + exp(-x))."""
    prefix, kernel = "sigmoid", "sigmoid"

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)


class Tanh(_Activation):
    """y = tanh(x)."""
    prefix, kernel = "tanh", "tanh"

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
