"""Convolution layer."""
from .. import init
from .base import Layer, pair, positive_pair, record_config


class Conv2D(Layer):
    """y = conv(x, w) + b.   x (N, C, H, W), w (K, C, kH, kW) -> y (N, K, oH, oW).

    padding: an int, a pair (pH, pW), 'same' (output H/stride, extra padding at the end) or
    'valid' (none). Weights He-normal (the nets here put a ReLU after a conv), bias zeros.
    """

    prefix, overwrites = "conv2d", True

    @record_config
    def __init__(self, filters, ksize, stride=1, padding=0, dilation=1, bias=True,
                 w_init="he_normal", name=None):
        super().__init__(name)
        if int(filters) <= 0:
            raise self.error(f"filters must be positive, got {filters!r}")
        self.K = int(filters)
        self.ksize = positive_pair(self, ksize, "kernel size")
        self.stride = positive_pair(self, stride, "stride")
        self.dilation = positive_pair(self, dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise self.error(f"unknown padding {padding!r}: expected an int, a pair, 'same' or 'valid'")
        elif min(pair(padding, "padding")) < 0:
            raise self.error(f"padding must be non-negative, got {padding!r}")
        self.padding, self.use_bias, self.w_init = padding, bias, w_init

    def build(self, in_shapes, device):
        shape, = in_shapes
        self.expect_rank(shape, 4)
        C = shape[1]
        self.w = self.param("w", (self.K, C, *self.ksize), self.w_init)
        self.b = self.param("b", (self.K,), init.zeros) if self.use_bias else None
        self.kern, self.dense = device.kernels.conv, device.kernels.dense
        try:
            self.plan = self.kern.conv2d_plan(shape, self.w.shape, self.stride, self.padding, self.dilation)
        except ValueError as e:
            raise self.error(f"input {shape[1:]}: {e}") from None
        return self.plan.out_shape

    def forward(self, xs, training):
        x, = xs
        self.saved = x
        return self.kern.conv2d_fprop(self.plan, x, self.w.data, None if self.b is None else self.b.data)

    def backward(self, gy):
        x = self.saved
        self.kern.conv2d_wgrad(self.plan, x, gy, self.w.grad, **self.grad_mode())
        if self.b is not None:
            self.dense.bias_grad(gy, self.b.grad, **self.grad_mode())
        return (None if not self.needs_gx else self.kern.conv2d_dgrad(self.plan, gy, self.w.data),)
