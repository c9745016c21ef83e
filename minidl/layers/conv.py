"""Convolution layer."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .. import init
from .._types import Array, BatchShape, IntOrPair
from ..padding import resolve_pads   # shape arithmetic, the same on every device and on the host
from .base import ALL, Layer, Need, _fmt, pair, positive_pair, record_config

if TYPE_CHECKING:
    from .._types import Initializer
    from ..backend import Device
    from ..kernels import contract


class Conv2D(Layer):
    """y = act(conv(x, w) + b).   x (N, C, H, W), w (K, C, kH, kW) -> y (N, K, oH, oW).

    padding: an int, a pair (pH, pW), (top, bottom, left, right), 'same' (output H/stride, extra
    padding at the end) or 'valid' (none). activation: None or 'relu' (applied to the output; the
    inference passes set it when they fuse a following ReLU). Weights He-normal, bias zeros.
    channels_last: y keeps its NCHW shape but lies in N, H, W, C order in memory, where the GPU's
    tensor-core convolutions run (set by the `channels_last` pass, not by hand; the CPU ignores it).
    residual: the layer reads a second input z of its output's shape and computes act(conv(x, w) + b + z)
    (set by the inference passes where a residual Add is the only reader of a conv that `takes_residual`:
    the GPU adds z and applies the ReLU in the GEMM's epilogue, one kernel and two passes over memory
    fewer; gz = the gradient after the ReLU).
    """

    prefix, overwrites_grads, activations, layouts = "conv2d", True, ("relu",), ("channels_last",)

    @record_config
    def __init__(self, filters: int, ksize: IntOrPair, stride: IntOrPair = 1, padding: IntOrPair | str = 0,
                 dilation: IntOrPair = 1, bias: bool = True, w_init: str | Initializer = "he_normal",
                 activation: str | None = None, channels_last: bool = False, residual: bool = False,
                 name: str | None = None) -> None:
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
        elif isinstance(padding, (list, tuple)) and len(padding) == 4:
            if min(int(p) for p in padding) < 0:
                raise self.error(f"padding must be non-negative, got {padding!r}")
            padding = tuple(int(p) for p in padding)
        elif min(pair(padding, "padding")) < 0:
            raise self.error(f"padding must be non-negative, got {padding!r}")
        self.padding, self.use_bias, self.w_init, self.channels_last = padding, bias, w_init, bool(channels_last)
        self.activation = self.check_activation(activation)
        self.residual = bool(residual)
        self.n_inputs = 2 if self.residual else 1

    @property
    def takes_residual(self) -> bool:  # type: ignore[override]  # a class attribute elsewhere
        """A 1x1 conv of stride 1, unpadded, is one GEMM, (N H W, C) x (C, K) channels-last: the GPU adds a
        residual and applies the ReLU in that GEMM's epilogue (kernels/gpu/conv.py)."""
        one = tuple(self.ksize) == (1, 1) and tuple(self.stride) == (1, 1)
        return one and not any(self.pads((1, 1, 1)))          # a 1x1 window's padding depends on no H, W

    @property
    def channels_last_params(self) -> tuple[str, ...]:  # type: ignore[override]  # a class attribute elsewhere
        """cuDNN's channels-last convolutions read K, kH, kW, C filters faster (a 1x1 filter lies both ways)."""
        return ("w",) if self.channels_last and tuple(self.ksize) != (1, 1) else ()

    kern: contract.Conv                 # build binds device.kernels.<family>, typed
    dense: contract.Dense
    act: contract.Activation
    merge: contract.Merge

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape = in_shapes[0]
        self.expect_rank(shape, 4)
        C = shape[1]
        self.w = self.param("w", (self.K, C, *self.ksize), self.w_init)
        self.b = self.param("b", (self.K,), init.zeros) if self.use_bias else None
        self.kern, self.dense, self.act, self.merge = self.kernel_families(device, "conv", "dense", "activation",
                                                                           "merge")
        try:
            self.plan = self.kern.conv2d_plan(shape, self.w.shape, self.stride, self.padding, self.dilation)
        except ValueError as e:
            raise self.error(f"input {shape[1:]}: {e}") from None
        if self.residual and tuple(in_shapes[1][1:]) != tuple(self.plan.out_shape[1:]):
            raise self.error(f"the residual input {_fmt(in_shapes[1])} is not the output's shape "
                             f"{_fmt(self.plan.out_shape)}")
        # conv + bias (+ residual) + ReLU in one call where the device offers it (inference; the conv
        # family's extras: a cuDNN graph, or for a residual conv a GEMM with its epilogue)
        fused = "conv2d_bias_add_act_fprop" if self.residual else "conv2d_bias_relu_fprop" if self.activation else None
        self._fused = getattr(self.kern, fused) if fused and device.has("conv", fused) else None
        return self.plan.out_shape

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, z = xs[0], (xs[1] if self.residual else None)
        b = None if self.b is None else self.b.data
        cl = {"cl": True} if self.channels_last else {}
        if self._fused is not None and b is not None and not training:
            args = (z, bool(self.activation)) if self.residual else ()
            y = self._fused(self.plan, x, self.w.data, b, *args, **cl)
        else:
            y = self.kern.conv2d_fprop(self.plan, x, self.w.data, b, **cl)
            if z is not None:                            # in place: y is fresh
                self.merge.add_fprop([y, z], out=y, relu=bool(self.activation))
            elif self.activation:
                self.act.relu_fprop(y, out=y)
        self.saved = (x, y)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        x, y = self.saved
        if self.activation:
            gy = self.act.relu_bprop(y, gy)
        self.kern.conv2d_wgrad(self.plan, x, gy, self.w.grad, **need.grad_kw)
        if self.b is not None:
            self.dense.bias_grad(gy, self.b.grad, **need.grad_kw)
        gx = self.kern.conv2d_dgrad(self.plan, gy, self.w.data) if need.input(0) else None
        return (gx, gy if need.input(1) else None) if self.residual else (gx,)

    def pads(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """(top, bottom, left, right) this conv pads an input of per-sample shape (C, H, W) with."""
        return resolve_pads(self.padding, in_shape[1:], self.ksize, self.stride, self.dilation)
