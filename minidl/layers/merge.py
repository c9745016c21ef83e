"""Add: the elementwise sum of two or more inputs (ResNet shortcuts)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, _fmt, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract


class Add(Layer):
    """y = act(x0 + x1 + ...)   all inputs (N, ...) of one shape; gx_i = gy.  activation: None or 'relu'."""

    prefix, n_inputs, first_index = "add", None, 1      # the C++ trainer numbered adds from add_1
    activations = ("relu",)

    @record_config
    def __init__(self, activation: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.activation = self.check_activation(activation)

    kern: contract.Merge                # build binds device.kernels.<family>, typed
    act: contract.Activation

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        first = tuple(in_shapes[0])
        for s in in_shapes[1:]:
            if tuple(s) != first:
                raise self.error("inputs must have one shape, got " + " and ".join(_fmt(s) for s in in_shapes))
        self.kern, self.act = self.kernel_families(device, "merge", "activation")
        self.n = len(in_shapes)
        return first

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        if not self.activation:
            return self.kern.add_fprop(xs)
        self.saved = y = self.kern.add_fprop(xs, relu=True)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        if self.activation:
            gy = self.act.relu_bprop(self.saved, gy)
        return tuple(gy if need.input(i) else None for i in range(self.n))
