"""Normalisation layers: BatchNorm2D (per channel, over the batch) and LRN (across channels)."""
from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from .. import init
from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from .._types import Initializer
    from ..backend import Device
    from ..kernels import contract


class BatchNorm2D(Layer):
    """y = gamma (x - mean) / sqrt(var + eps) + beta per channel.   x (N, C, H, W) -> y (N, C, H, W).

    Training uses the batch's statistics over (N, H, W) and updates running_mean/var
    (r = (1 - momentum) r + momentum * batch, variance unbiased); evaluation uses the running ones.
    Backward in training differentiates through the batch statistics; in evaluation the layer is
    the fixed affine map y = gamma * xhat + beta, and backward is that map's gradient only.
    """

    prefix, kind = "fbn", "batchnorm"       # the C++ trainer's "fused batch norm"
    overwrites_grads, activations = True, ("relu",)
    keeps_fp32 = True                       # batch statistics in float32 under any precision policy
    io_in_compute_dtype = True              # ...from x in the compute dtype, y rounded to it: no casts
    momentum: float
    eps: float

    @record_config
    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, gamma_init: str | Initializer = "ones",
                 activation: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.gamma_init = gamma_init
        self.activation = self.check_activation(activation)
        if not (isinstance(momentum, Real) and 0.0 <= momentum <= 1.0):
            raise self.error(f"momentum must be in [0, 1], got {momentum!r}")
        if not (isinstance(eps, Real) and eps > 0.0):
            raise self.error(f"eps must be positive, got {eps!r}")
        self.momentum, self.eps = float(momentum), float(eps)

    kern: contract.Norm                 # build binds device.kernels.<family>, typed
    dense: contract.Dense
    act: contract.Activation

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.expect_rank(shape, 4)
        C = shape[1]
        self.gamma = self.param("gamma", (C,), self.gamma_init)
        self.beta = self.param("beta", (C,), init.zeros)
        self.running_mean = self.state("running_mean", (C,), init.zeros)
        self.running_var = self.state("running_var", (C,), init.ones)
        self.kern, self.dense, self.act = self.kernel_families(device, "norm", "dense", "activation")
        self._zeros = self._ones = None     # evaluation-mode backward constants, made at first use
        return tuple(shape)

    def check_weights(self, weights: Mapping[str, ArrayLike]) -> None:
        """A variance below zero would make evaluation's sqrt(var + eps) NaN for every image: refused."""
        if "running_var" in weights:
            negative = int(np.count_nonzero(np.asarray(weights["running_var"], dtype=np.float64) < 0))
            if negative:
                raise self.error(f"running_var holds {negative} negative value(s); a variance is >= 0")

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        g, b, rm, rv = self.gamma.data, self.beta.data, self.running_mean.data, self.running_var.data
        if not training:
            y = self.kern.bn_fprop_infer(x, g, b, rm, rv, self.eps)
            if self.activation:
                self.act.relu_fprop(y, out=y)
            self.saved = (x, None, None, y)
            return y
        if x.size // x.shape[1] < 2:
            raise self.error(f"training needs more than one value per channel, got {tuple(x.shape)}")
        relu = {"relu": True} if self.activation else {}
        y, mean, invstd = self.kern.bn_fprop_train(x, g, b, rm, rv, self.momentum, self.eps, **relu)
        self.saved = (x, mean, invstd, y)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        x, mean, invstd, y = self.saved
        if mean is not None:
            relu = {"y": y, "relu": True} if self.activation else {}
            return (self.kern.bn_bprop(x, gy, self.gamma.data, mean, invstd, self.gamma.grad,
                                       self.beta.grad, **relu, **need.grad_kw),)
        if self.activation:
            gy = self.act.relu_bprop(y, gy)
        io = x.dtype                         # a policy's compute dtype: the affine map's gradients in float32
        f32 = self.gamma.data.dtype
        x, gy = x.astype(f32, copy=False), gy.astype(f32, copy=False)
        # Evaluation: the interface has no separate kernel, so the affine map's gradients are
        # composed from existing ones: xhat and gx are bn_fprop_infer with gamma=1/beta=0 and mean=0.
        rv = self.running_var.data
        if self._zeros is None:             # allocated once, not per step
            self._zeros, self._ones = self.device.xp.zeros_like(rv), self.device.xp.ones_like(rv)
        xhat = self.kern.bn_fprop_infer(x, self._ones, self._zeros, self.running_mean.data, rv, self.eps)
        self.dense.bias_grad(gy * xhat, self.gamma.grad, **need.grad_kw)
        self.dense.bias_grad(gy, self.beta.grad, **need.grad_kw)
        gx = self.kern.bn_fprop_infer(gy, self.gamma.data, self._zeros, self._zeros, rv, self.eps)
        return (gx.astype(io, copy=False),)


    def fold_into_producer(self, producer: Layer, weights: dict[str, np.ndarray]
                           ) -> tuple[Layer, dict[str, np.ndarray]] | None:
        """A conv read only by this BN takes over its evaluation map (running statistics):
        w' = gamma w / sqrt(var + eps),  b' = gamma (b - mean) / sqrt(var + eps) + beta."""
        if producer.kind != "conv2d":
            return None
        mine = {k: weights[f"{self.name}/{k}"] for k in ("gamma", "beta", "running_mean", "running_var")}
        s = mine["gamma"] / np.sqrt(mine["running_var"] + self.eps)                    # (K,)
        w = weights[f"{producer.name}/w"] * s[:, None, None, None]                     # (K, C, kH, kW)
        b = (weights.get(f"{producer.name}/b", 0.0) - mine["running_mean"]) * s + mine["beta"]
        return producer.clone(bias=True, activation=self.activation), {"w": w, "b": b}


class LRN(Layer):
    """y = x (k + alpha/size * sum_window x^2)^-beta across channels.   x (N, C, H, W) -> y (N, C, H, W).

    The window holds `size` channels centred on c, clipped at the edges; for even sizes it
    reaches one channel further ahead than behind, as cuDNN's lrnN. Defaults are cuDNN's
    (Krizhevsky et al., 2012).
    """

    prefix = "lrn"
    keeps_fp32 = True                       # a sum of squares: overflows float16's range early
    size: int
    alpha: float
    beta: float
    k: float

    @record_config
    def __init__(self, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0,
                 name: str | None = None) -> None:
        super().__init__(name)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise self.error(f"size must be a positive int, got {size!r}")
        if not (isinstance(alpha, Real) and alpha >= 0.0):
            raise self.error(f"alpha must be non-negative, got {alpha!r}")
        if not (isinstance(beta, Real) and beta >= 0.0):
            raise self.error(f"beta must be non-negative, got {beta!r}")
        # k > 0 with alpha >= 0 keeps the scale positive, so scale^-beta is finite.
        if not (isinstance(k, Real) and k > 0.0):
            raise self.error(f"k must be positive, got {k!r}")
        self.size, self.alpha, self.beta, self.k = size, float(alpha), float(beta), float(k)

    def hyper(self) -> tuple[int, float, float, float]:
        return self.size, self.alpha, self.beta, self.k

    kern: contract.Lrn                  # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.expect_rank(shape, 4)
        self.kern, = self.kernel_families(device, "lrn")
        return tuple(shape)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        y, scale = self.kern.lrn_fprop(x, *self.hyper())
        self.saved = (x, y, scale)
        return y

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        x, y, scale = self.saved
        return (self.kern.lrn_bprop(x, y, scale, gy, *self.hyper()),)
