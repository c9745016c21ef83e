"""Elementwise activations: ReLU, LeakyReLU, Sigmoid, Tanh.

An activation is written once, here: its forward `f(xp, x)` and backward `df(xp, s, gy)` as
expressions of NumPy's API over `xp`, the device's array module (CuPy runs the same), and its ONNX
operator. Every backend computes them through its activation family's `elementwise` (in float32 for
half-precision arrays, in the input's memory order); a backend with a fused kernel pair for one
(`kernel`: the GPU's ElementwiseKernels, the CPU's ReLU) runs that instead. A new activation is a
class below, named in `__all__`: minidl.layers exports it, and the tests of every layer find it.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

from .._types import Array, BatchShape
from .base import ALL, Layer, Need

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract

__all__ = ["ReLU", "LeakyReLU", "Sigmoid", "Tanh"]


class _Activation(Layer):
    """Shape-preserving elementwise layer: subclasses write `f` and `df` (and say what `df` reads)."""

    kernel: str | None = None     # a fused pair a backend may offer instead: "relu" -> relu_fprop / relu_bprop
    needs_input = False           # df reads x (else y, the output)
    onnx_op: str | None = None    # the ONNX operator computing it, with `onnx_attributes()`

    def f(self, xp: Any, x: Array) -> Array:
        """y of x, elementwise, over the array module `xp` (NumPy's API; no host reads: a step is captured)."""
        raise NotImplementedError

    def df(self, xp: Any, s: Array, gy: Array) -> Array:
        """gx of gy, elementwise; s is x where `needs_input`, else y."""
        raise NotImplementedError

    def kernel_args(self) -> tuple[float, ...]:
        """The fused kernels' arguments after the arrays (LeakyReLU: alpha)."""
        return ()

    def onnx_attributes(self) -> dict[str, Any]:
        """The ONNX node's attributes."""
        return {}

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        act: contract.Activation
        act, = self.kernel_families(device, "activation")
        if self.kernel and device.has("activation", f"{self.kernel}_fprop"):
            self.fprop, self.bprop = getattr(act, f"{self.kernel}_fprop"), getattr(act, f"{self.kernel}_bprop")
            self.args = self.kernel_args()
        else:                                   # the expressions, on this device's array module
            self.fprop = functools.partial(act.elementwise, self.f)
            self.bprop = functools.partial(act.elementwise, self.df)
            self.args = ()
        return shape

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        y = self.fprop(x, *self.args)
        self.saved = x if self.needs_input else y
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (self.bprop(self.saved, gy, *self.args),)

    def onnx(self, builder: Any, ins: list[str], out: str, weights: dict[str, Array]) -> str:
        """The ONNX export's hook (minidl.inference.onnx_export): one node of `onnx_op`."""
        if self.onnx_op is None:
            raise self.error("has no ONNX mapping: give the class an onnx_op, or an onnx(builder, ins, out, weights) "
                             "method")
        return builder.op(self.onnx_op, ins, out, **self.onnx_attributes())


class ReLU(_Activation):
    """y = max(x, 0).  The fusion pass lets the layer before apply it where that layer can."""
    prefix, kernel, fusable_activation, onnx_op = "relu", "relu", "relu", "Relu"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    def f(self, xp: Any, x: Array) -> Array:
        return xp.maximum(x, 0)

    def df(self, xp: Any, y: Array, gy: Array) -> Array:
        return xp.where(y > 0, gy, 0)


class LeakyReLU(_Activation):
    """y = x if x > 0 else alpha x."""
    prefix, kernel, needs_input, onnx_op = "leaky_relu", "leaky_relu", True, "LeakyRelu"

    def __init__(self, alpha: float = 0.01, name: str | None = None) -> None:
        super().__init__(name)
        if not alpha >= 0:
            raise self.error(f"alpha must be non-negative, got {alpha!r}")
        self.alpha = float(alpha)

    def f(self, xp: Any, x: Array) -> Array:
        return xp.where(x > 0, x, self.alpha * x)

    def df(self, xp: Any, x: Array, gy: Array) -> Array:
        return xp.where(x > 0, gy, self.alpha * gy)

    def kernel_args(self) -> tuple[float, ...]:
        return (self.alpha,)

    def onnx_attributes(self) -> dict[str, Any]:
        return {"alpha": self.alpha}


class Sigmoid(_Activation):
    """y = 1 / (1 + exp(-x))."""
    prefix, kernel, onnx_op = "sigmoid", "sigmoid", "Sigmoid"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    def f(self, xp: Any, x: Array) -> Array:
        return 0.5 + 0.5 * xp.tanh(0.5 * x)          # (1 + tanh(x/2)) / 2: no exp overflows

    def df(self, xp: Any, y: Array, gy: Array) -> Array:
        return gy * (y * (1 - y))


class Tanh(_Activation):
    """y = tanh(x)."""
    prefix, kernel, onnx_op = "tanh", "tanh", "Tanh"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)

    def f(self, xp: Any, x: Array) -> Array:
        return xp.tanh(x)

    def df(self, xp: Any, y: Array, gy: Array) -> Array:
        return gy * (1 - y * y)
