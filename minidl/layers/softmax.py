"""Softmax over the class axis."""
from .base import Layer


class Softmax(Layer):
    """y_k = exp(x_k) / sum_j exp(x_j) over axis 1.   x (N, K) -> y (N, K).

    Trainers take the cross-entropy from this layer's input (the logits) rather than from its
    rounded output; see Model.backward(from_logits=True).
    """

    prefix = "softmax"

    def build(self, in_shapes, device):
        shape, = in_shapes
        if len(shape) != 2:
            raise self.error(f"expects a 2-D input (N, classes), got shape {shape}")
        self.kern = device.kernels.softmax
        return shape

    def forward(self, xs, training):
        x, = xs
        self.saved = y = self.kern.softmax_fprop(x)
        return y

    def backward(self, gy):
        return (self.kern.softmax_bprop(self.saved, gy),)
