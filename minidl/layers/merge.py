"""Add: the elementwise sum of two or more inputs (ResNet shortcuts)."""
from .base import ALL, Layer, _fmt, record_config


class Add(Layer):
    """y = act(x0 + x1 + ...)   all inputs (N, ...) of one shape; gx_i = gy.  activation: None or 'relu'."""

    prefix, n_inputs, first_index = "add", None, 1      # the seed numbered adds from add_1
    activations = ("relu",)

    @record_config
    def __init__(self, activation=None, name=None):
        super().__init__(name)
        self.activation = self.check_activation(activation)

    def build(self, in_shapes, device):
        first = tuple(in_shapes[0])
        for s in in_shapes[1:]:
            if tuple(s) != first:
                raise self.error("inputs must have one shape, got " + " and ".join(_fmt(s) for s in in_shapes))
        self.kern, self.act = self.kernel_families(device, "merge", "activation")
        self.n = len(in_shapes)
        return first

    def forward(self, xs, training):
        if not self.activation:
            return self.kern.add_fprop(xs)
        self.saved = y = self.kern.add_fprop(xs, relu=True)
        return y

    def backward(self, gy, need=ALL):
        if self.activation:
            gy = self.act.relu_bprop(self.saved, gy)
        return tuple(gy if need.input(i) else None for i in range(self.n))
