"""Normalize: the preprocessing a model carries at its input, so every entry point takes the same images.

The name and arguments are torchvision's `Normalize(mean, std)` (what MNIST code copies:
0.1307, 0.3081), in Keras's place for it, a layer of the model (`keras.layers.Normalization`
takes a variance instead, which nobody has at hand for MNIST). The division of uint8 images by
255 is not a layer: the dtype decides it at the entry (docs/input.md), so uint8 in [0, 255] and
floats in [0, 1] reach this layer as the same floats in [0, 1].
"""
from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .._types import Array, BatchShape
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device
    from ..kernels import contract

MNIST = (0.1307, 0.3081)       # MNIST's pixel mean and standard deviation in [0, 1] (torchvision's values)


class Normalize(Layer):
    """y = (x - mean) / std per channel.   x (N, C, ...) images in [0, 1] -> y (N, C, ...).

    mean, std: one number for every channel, or one per channel (C of them). No parameters: the
    two are constants of the model's config, so checkpoints hold the same weights with it or without.
    Declared for the passes and the data loader (`takes_images`): it reads the input contract's
    images, so a Loader may apply it to the whole data set once instead (the training lowering
    drops it, `passes.drop_preprocessing`), and the inference lowering folds it into the conv
    reading it where that is exact (`affine()`; `passes.fold_preprocessing`).
    """

    prefix = kind = "normalize"
    takes_images = True            # reads the input contract's images (floats in [0, 1]; uint8 / 255 at the entry)
    keeps_fp32 = True              # normalised in float32, rounded once to a policy's compute dtype after it

    @record_config
    def __init__(self, mean: float | Sequence[float] = MNIST[0], std: float | Sequence[float] = MNIST[1],
                 name: str | None = None) -> None:
        super().__init__(name)
        self.mean, self.std = self._values(mean, "mean"), self._values(std, "std")
        if min(self.std) <= 0:
            raise self.error(f"std must be positive, got {std!r}")
        if len(self.mean) != len(self.std) and 1 not in (len(self.mean), len(self.std)):
            raise self.error(f"mean and std give {len(self.mean)} and {len(self.std)} channels")

    def _values(self, v, what):
        t = tuple(v) if isinstance(v, (list, tuple)) else (v,)
        if not t or not all(isinstance(a, Real) and not isinstance(a, bool) and np.isfinite(float(a)) for a in t):
            raise self.error(f"{what} must be a finite number or a list of them, got {v!r}")
        return tuple(float(a) for a in t)

    def affine(self, C: int) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) float64 (C,) with y = a x + b per channel: a = 1/std, b = -mean/std."""
        mean, std = np.broadcast_to(self.mean, (C,)), np.broadcast_to(self.std, (C,))
        return 1.0 / std, -mean / std

    kern: contract.Norm | None          # build binds device.kernels.<family>, typed

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        if len(shape) < 2:
            raise self.error(f"expects (N, C, ...) inputs, got shape {shape}")
        C = shape[1]
        if max(len(self.mean), len(self.std)) not in (1, C):
            raise self.error(f"has {max(len(self.mean), len(self.std))} channels of mean/std, its input {C}")
        self.kern = self.kernel_families(device, "norm")[0] if len(shape) == 4 else None
        dt, xp = device.dtype, device.xp
        a, _ = self.affine(C)
        bcast = (C,) + (1,) * (len(shape) - 2)
        # the Loader's arithmetic in x's dtype, x - mean then / std: the same values it gives
        self._mean = xp.asarray(np.broadcast_to(self.mean, (C,)).reshape(bcast), dtype=dt)
        self._std = xp.asarray(np.broadcast_to(self.std, (C,)).reshape(bcast), dtype=dt)
        # the norm family's one inference kernel: gamma (x - rm) / sqrt(rv + eps) + beta, with rv = 0, eps = 1
        mean = np.broadcast_to(self.mean, (C,))
        self._k = tuple(xp.asarray(v, dtype=dt) for v in (a, np.zeros(C), mean, np.zeros(C)))
        return tuple(shape)

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        if training or self.kern is None:
            return (x - self._mean) / self._std
        g, beta, rm, rv = self._k
        return self.kern.bn_fprop_infer(x, g, beta, rm, rv, 1.0)     # one kernel where it stays in inference

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        return (gy / self._std if need.input(0) else None,)
