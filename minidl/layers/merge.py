"""Add: the elementwise sum of two or more inputs (ResNet shortcuts)."""
from .base import Layer, _fmt


class Add(Layer):
    """y = x0 + x1 + ...   all inputs (N, ...) of one shape; gx_i = gy."""

    prefix, n_inputs, first_index = "add", None, 1      # the seed numbered adds from add_1
    fuse_relu = False      # set by Model.fuse: this layer also applies the ReLU that follows it

    def build(self, in_shapes, device):
        first = tuple(in_shapes[0])
        for s in in_shapes[1:]:
            if tuple(s) != first:
                raise self.error("inputs must have one shape, got " + " and ".join(_fmt(s) for s in in_shapes))
        self.n, self.kern, self.act = len(in_shapes), device.kernels.merge, device.kernels.activation
        return first

    def forward(self, xs, training):
        if not self.fuse_relu:
            return self.kern.add_fprop(xs)
        self.saved = y = self.kern.add_fprop(xs, relu=True)
        return y

    def backward(self, gy):
        if self.fuse_relu:
            gy = self.act.relu_bprop(self.saved, gy)
        return (gy,) * self.n
