"""Pooling layers: max and average over sliding windows, and global average pooling."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .._types import Array, BatchShape, IntOrPair
from .base import ALL, Layer, Need, pair, positive_pair, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract


class _Pool2D(Layer):
    """Shared by the windowed pools: hyper-parameter checks, and the plan made in build."""

    def __init__(self, ksize: IntOrPair, stride: IntOrPair | None, padding: IntOrPair | str, name: str | None) -> None:
        super().__init__(name)
        self.ksize = positive_pair(self, ksize, "kernel size")
        self.stride = self.ksize if stride is None else positive_pair(self, stride, "stride")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise self.error(f"unknown padding {padding!r}: expected an int, a pair, 'same' or 'valid'")
        else:
            try:
                pH, pW = pair(padding, "padding")
            except (TypeError, ValueError):
                raise self.error(f"padding must be an int, a pair, 'same' or 'valid', "
                                 f"got {padding!r}") from None
            if min(pH, pW) < 0:
                raise self.error(f"padding must be non-negative, got {padding!r}")
            if 2 * pH > self.ksize[0] or 2 * pW > self.ksize[1]:
                raise self.error(f"padding {padding!r} is more than half the "
                                 f"{self.ksize[0]}x{self.ksize[1]} window")
        self.padding = padding

    kern: contract.Pool                 # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.expect_rank(shape, 4)
        self.kern, = self.kernel_families(device, "pool")
        try:
            self.plan = self.kern.pool2d_plan(shape, self.ksize, self.stride, self.padding)
        except ValueError as e:
            raise self.error(f"input {shape[1:]}: {e}") from None
        return self.plan.out_shape


class MaxPool2D(_Pool2D):
    """y = max of each kH x kW window.   x (N, C, H, W) -> y (N, C, oH, oW).

    stride defaults to the window; padding (int, pair, 'same', 'valid') is read as -inf, and
    at most half a window. Output size rounds down (PyTorch, cuDNN). The gradient of each
    window goes to its first maximum (row-major), as PyTorch and deterministic cuDNN.
    """

    prefix = "pool"
    # max(f(a), f(b)) = f(max(a, b)) for a non-decreasing f, and the first max is the same cell
    commutes_with = ("relu",)

    @record_config
    def __init__(self, ksize: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair | str = 0,
                 name: str | None = None) -> None:
        super().__init__(ksize, stride, padding, name)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        y = self.kern.maxpool2d_fprop(self.plan, x)
        self.saved = x, y
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        x, y = self.saved
        return (self.kern.maxpool2d_bprop(self.plan, x, y, gy),)


class AvgPool2D(_Pool2D):
    """y = sum of each kH x kW window / (kH kW).   x (N, C, H, W) -> y (N, C, oH, oW).

    Padding cells count as zeros in the divisor (PyTorch's count_include_pad=True; note that
    Keras/TensorFlow 'same' average pooling divides by the real cells only).
    """

    prefix = "avgpool"

    @record_config
    def __init__(self, ksize: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair | str = 0,
                 name: str | None = None) -> None:
        super().__init__(ksize, stride, padding, name)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        return self.kern.avgpool2d_fprop(self.plan, x)

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.kern.avgpool2d_bprop(self.plan, gy),)


class GlobalAvgPool2D(Layer):
    """y = mean of x over H, W.   x (N, C, H, W) -> y (N, C, 1, 1)."""

    prefix = "gap"

    @record_config
    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    kern: contract.Pool                 # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.expect_rank(shape, 4)
        self.kern, = self.kernel_families(device, "pool")
        return (shape[0], shape[1], 1, 1)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        self.saved = x.shape
        return self.kern.global_avgpool_fprop(x)

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.kern.global_avgpool_bprop(gy, self.saved),)
