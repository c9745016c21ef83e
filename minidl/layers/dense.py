"""Dense (fully connected) and Flatten."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .. import init
from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from .._types import Initializer
    from ..backend import Device
    from ..kernels import contract


class Flatten(Layer):
    """x (N, d1, d2, ...) -> (N, d1*d2*...): a view, no copy."""

    prefix = "flatten"

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.in_shape = tuple(shape[1:])
        return (shape[0], int(np.prod(self.in_shape)))

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        return x.reshape(x.shape[0], -1)                       # (N, C*H*W)

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (gy.reshape(gy.shape[0], *self.in_shape),)     # (N, C, H, W)


class Dense(Layer):
    """y = act(x w^T + b).   x (N, C), w (K, C), b (K,) -> y (N, K).   activation: None or 'relu'."""

    prefix, overwrites_grads, activations = "dense", True, ("relu",)

    @record_config
    def __init__(self, units: int, bias: bool = True, w_init: str | Initializer = "he_normal",
                 activation: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        if int(units) <= 0:
            raise self.error(f"units must be positive, got {units!r}")
        self.K, self.use_bias, self.w_init = int(units), bias, w_init
        self.activation = self.check_activation(activation)

    kern: contract.Dense                # build binds device.kernels.<family>, typed
    act: contract.Activation

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        if len(shape) != 2:
            raise self.error(f"expects a 2-D input (N, features), got shape {shape}; put a Flatten before it")
        self.w = self.param("w", (self.K, shape[1]), self.w_init)
        self.b = self.param("b", (self.K,), init.zeros) if self.use_bias else None
        self.kern, self.act = self.kernel_families(device, "dense", "activation")
        return (shape[0], self.K)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        y = self.kern.dense_fprop(x, self.w.data, None if self.b is None else self.b.data)
        if self.activation:
            self.act.relu_fprop(y, out=y)                # in place: y is fresh
        self.saved = (x, y)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        x, y = self.saved
        if self.activation:
            gy = self.act.relu_bprop(y, gy)
        self.kern.dense_wgrad(x, gy, self.w.grad, **need.grad_kw)
        if self.b is not None:
            self.kern.bias_grad(gy, self.b.grad, **need.grad_kw)
        return (self.kern.dense_dgrad(gy, self.w.data) if need.input(0) else None,)
