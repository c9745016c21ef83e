"""Elementwise activations: ReLU, LeakyReLU, Sigmoid, Tanh."""
from .base import ALL, Layer, record_config


class _Activation(Layer):
    """Shape-preserving elementwise layer; subclasses name the kernel pair and what backward needs."""

    kernel = None            # "relu" -> relu_fprop / relu_bprop
    needs_input = False      # backward reads x (else y)

    def build(self, in_shapes, device):
        shape, = in_shapes
        act, = self.kernel_families(device, "activation")
        self.fprop, self.bprop = getattr(act, f"{self.kernel}_fprop"), getattr(act, f"{self.kernel}_bprop")
        return shape

    def extra(self):
        return ()

    def forward(self, xs, training):
        x, = xs
        y = self.fprop(x, *self.extra())
        self.saved = x if self.needs_input else y
        return y

    def backward(self, gy, need=ALL):
        return (self.bprop(self.saved, gy, *self.extra()),)


class ReLU(_Activation):
    """y = max(x, 0).  The fusion pass lets the layer before apply it where that layer can."""
    prefix, kernel, fusable_activation = "relu", "relu", "relu"

    @record_config
    def __init__(self, name=None):
        super().__init__(name)


class LeakyReLU(_Activation):
    """y = x if x > 0 else alpha x."""
    prefix, kernel, needs_input = "leaky_relu", "leaky_relu", True

    @record_config
    def __init__(self, alpha=0.01, name=None):
        super().__init__(name)
        if not alpha >= 0:
            raise self.error(f"alpha must be non-negative, got {alpha!r}")
        self.alpha = float(alpha)

    def extra(self):
        return (self.alpha,)


class Sigmoid(_Activation):
    """y = 1 / (1 + exp(-x))."""
    prefix, kernel = "sigmoid", "sigmoid"

    @record_config
    def __init__(self, name=None):
        super().__init__(name)


class Tanh(_Activation):
    """y = tanh(x)."""
    prefix, kernel = "tanh", "tanh"

    @record_config
    def __init__(self, name=None):
        super().__init__(name)
