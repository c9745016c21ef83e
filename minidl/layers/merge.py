"""Add: the elementwise sum of two or more inputs (ResNet shortcuts)."""
from .base import Layer, _fmt


class Add(Layer):
    """y = x0 + x1 + ...   all inputs (N, ...) of one shape; gx_i = gy."""

    prefix, n_inputs, first_index = "add", None, 1      # the seed numbered adds from add_1

    def build(self, in_shapes, device):
        first = tuple(in_shapes[0])
        for s in in_shapes[1:]:
            if tuple(s) != first:
                raise self.error("inputs must have one shape, got " + " and ".join(_fmt(s) for s in in_shapes))
        self.n, self.kern = len(in_shapes), device.kernels.merge
        return first

    def forward(self, xs, training):
        return self.kern.add_fprop(xs)

    def backward(self, gy):
        return (gy,) * self.n
