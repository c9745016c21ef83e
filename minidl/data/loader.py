"""Mini-batches of a whole dataset held on the device, reshuffled every epoch by a seeded generator.

The images a model takes and how they are normalised are the model's input contract
(layers/input_contract.py); the Loader applies it. Its names are re-exported here, where users found them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..layers.input_contract import CONTRACT, Model, images_in, normalization, pixel_scale, preprocessing, takes_images
from .checks import CLASSES, check_images, check_labels
from .errors import DataError

if TYPE_CHECKING:
    from .._types import Array
    from ..backend import Device

__all__ = ["CONTRACT", "MNIST_MEAN", "MNIST_STD", "Loader", "Model", "background", "check_normalization", "images_in",
           "normalization", "on_device", "pixel_scale", "preprocessing", "takes_images"]

# MNIST's pixel mean and standard deviation after scaling to [0, 1] (the usual torchvision values)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def check_normalization(model: Model, loader: Loader, where: str = "fit") -> None:
    """A Loader given to fit or evaluate must apply what `model` declares (its Normalize's mean and std,
    which the training lowering drops; nothing for a model without one); else one DataError."""
    want, got = _pair(normalization(model)), _pair(loader.normalize)
    if got != want:
        declares = f"declares {want}" if want else "carries no Normalize: it takes the images as they are"
        does = f"normalises with {got}" if got else "does not normalise"
        raise DataError(f"{where}: the Loader {does}, but {model.name} {declares}: build the Loader with "
                        "normalize=data.loader.normalization(model) (docs/input.md)")


def _pair(normalize):
    if normalize is False:
        return None
    mean, std = (MNIST_MEAN, MNIST_STD) if normalize is True else normalize
    return tuple(np.atleast_1d(np.asarray(mean, float)).tolist()), tuple(np.atleast_1d(np.asarray(std, float)).tolist())


def on_device(images: np.ndarray, scale: int, device: Device, normalize: bool | tuple[Any, Any],
              out: Array | None = None) -> tuple[Array, float]:
    """(x, blank): host `images` (N, H, W) or (N, C, H, W), checked (pixel_scale gave `scale`), as device
    x (N, C, H, W) in device.dtype, divided by `scale` and normalised as `normalize` says (the Loader's);
    blank: what a 0 (background) pixel became, the fill of shifted images. out: a device array to write
    x into (a fixed buffer a captured step reads), else a new one."""
    xp, N = device.xp, len(images)
    shape = images.shape if images.ndim == 4 else (N, 1, *images.shape[1:])
    # uint8 travels to the device (4x less than float32) and is converted there; floats travel in
    # the device's dtype. astype copies, so the in-place steps below never touch the caller's array
    if scale == 1 and images.dtype != device.dtype:
        images = images.astype(device.dtype)
    x = xp.asarray(images).reshape(shape)                        # (N, C, H, W)
    if out is not None and scale == 1:
        xp.copyto(out, x)
        x = out
    elif out is not None:
        xp.divide(x, device.dtype.type(scale), out=out, dtype=device.dtype)
        x = out
    else:   # one kernel converts and scales (astype and then /= compiled two on a cold cache)
        x = x.astype(device.dtype) if scale == 1 else xp.divide(x, device.dtype.type(scale), dtype=device.dtype)
    if normalize is not False:
        mean, std = (MNIST_MEAN, MNIST_STD) if normalize is True else normalize
        if np.ndim(mean) or np.ndim(std):     # one per channel: (C, 1, 1) against (N, C, H, W)
            mean, std = (xp.asarray(np.reshape(v, (-1, 1, 1)), dtype=device.dtype) for v in (mean, std))
        x -= mean
        x /= std
    return x, background(normalize, device.dtype)


def background(normalize: bool | tuple[Any, Any], dtype: np.dtype) -> float:
    """What a 0 (background) pixel becomes once normalised as `normalize` says, in `dtype` as the
    images were: the fill of shifted images (per-channel statistics that differ: 0)."""
    if normalize is False:
        return 0.0
    mean, std = (MNIST_MEAN, MNIST_STD) if normalize is True else normalize
    values = np.unique((dtype.type(0) - np.asarray(mean, dtype)) / np.asarray(std, dtype))
    return float(values[0]) if len(values) == 1 else 0.0


def batches_per_epoch(loader: Any) -> int:
    """A loader's global batches an epoch (`N`, `global_batch`, `drop_last`): the Loader's and the host
    loaders' one rule, so a dataset runs the steps its arrays would."""
    full, rest = divmod(loader.N, loader.global_batch)
    return full + (1 if rest and not loader.drop_last else 0)


def epoch_order(loader: Any, epoch: int) -> np.ndarray:
    """The host permutation of range(N) that epoch `epoch` visits (`shuffle`, `seed`): one rule for the
    Loader and the host loaders, so a dataset visits its samples in the arrays' order and resumes alike."""
    if not loader.shuffle:
        return np.arange(loader.N)
    return np.random.default_rng([loader.seed, epoch]).permutation(loader.N)


class Loader:
    """Batches (x, y) of images (N, H, W) or (N, C, H, W) -> x (B, C, H, W) device.dtype, y (B,) int32.

    Images are uint8 in [0, 255] or floating point in [0, 1] (pixel_scale; docs/input.md): a float
    image equal to uint8/255 gives the same batches, to the rounding of x's dtype. The whole set is
    copied to the device once: x = (images/scale - 0.1307) / 0.3081 when `normalize` is True
    (MNIST's mean/std; pass a (mean, std) pair, each a number or one per channel, for other data,
    False for plain [0, 1]). A model that carries its preprocessing (layers.Normalize) declares the
    pair: `normalization(model)` is what to pass, so training runs no kernel for it.
    Epoch e visits the samples in a permutation drawn from NumPy's generator seeded with (seed, e),
    so any batch of any epoch can be rebuilt exactly: `batch(e, k)` is the k-th batch that
    iterating epoch e yields, which is how a resumed run continues mid-epoch.
    Labels must be integers in [0, classes): checked here, where user arrays enter, so a -1 or a
    15 fails at once with a DataError instead of training as another class or failing in the loss.
    Data-parallel ranks (minidl.distributed): with `world` N, `batch_size` b is this rank's part
    of a global batch of N*b drawn from the same permutation, and rank r takes slice r of each,
    so N ranks at b see exactly the images one process sees at N*b.
    """

    def __init__(self, images: np.typing.ArrayLike, labels: np.typing.ArrayLike, batch_size: int, device: Device,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 normalize: bool | tuple[Any, Any] = True, classes: int = CLASSES, rank: int = 0,
                 world: int = 1) -> None:
        images, labels = np.asarray(images), np.asarray(labels)
        check_labels(labels, "Loader labels", classes, hint="; pass classes= for another count")
        check_images(images, labels, "Loader images")
        scale = pixel_scale(images, "Loader images")
        if not 0 <= rank < world:
            raise DataError(f"Loader: rank {rank} is not one of the {world} ranks")
        self.N, self.batch_size, self.rank, self.world = len(images), int(batch_size), rank, world
        self.global_batch = self.batch_size * world
        if self.batch_size < 1 or (drop_last and self.N < self.global_batch):
            raise DataError(f"Loader: batch_size {batch_size}" + (f" x {world} ranks" if world > 1 else "")
                            + f" for {self.N} samples with drop_last={drop_last} gives no batch")
        self.device, self.shuffle, self.seed, self.drop_last = device, shuffle, seed, drop_last
        self.epoch = 0  # the epoch the next `iter(loader)` runs; set it to resume
        self.normalize = normalize
        x, self.blank = on_device(images, scale, device, normalize)     # (N, C, H, W); the background's value
        self.x, self.y = x, device.asarray(labels, dtype=np.int32)
        self.label_max = int(labels.max())     # read here, from the host: a check per evaluation costs no device read
        self._order: tuple[int | None, Array] = (None, None)  # (epoch, device index array): for batch() calls
        self._next: tuple[int | None, Array] = (None, None)   # the next epoch's, sent mid-epoch (indices)

    exhausted = False    # the whole set is at hand: an epoch never runs out early (host_loader.HostLoader's can)

    def __len__(self) -> int:
        """Batches per epoch (global batches: every rank runs as many)."""
        return batches_per_epoch(self)

    def order(self, epoch: int) -> np.ndarray:
        """Host int64 permutation of range(N) that epoch `epoch` visits."""
        return epoch_order(self, epoch)

    def indices(self, epoch: int, k: int) -> Array:
        """The device indices of this rank's part of the k-th batch of epoch `epoch` (a view: no
        copy, no transfer); empty for a rank past the end of a last, partial batch.

        One transfer an epoch: the next epoch's order is drawn and sent at this one's middle batch,
        while the device still has steps queued. Drawn at the epoch's first batch instead, it kept
        the device idle for the draw (a permutation of N) wherever the host had just waited for the
        device there (the epoch's History record reads the step count under a schedule)."""
        n = len(self)
        if not 0 <= k < n:
            raise IndexError(f"batch {k} out of range: an epoch has {n} batches")
        if self._order[0] != epoch:
            self._order = self._next if self._next[0] == epoch else self._sent(epoch)
        if k == n // 2 and self._next[0] != epoch + 1:
            self._next = self._sent(epoch + 1)
        start = k * self.global_batch + self.rank * self.batch_size
        return self._order[1][start:start + self.batch_size]

    def _sent(self, epoch):
        return epoch, self.device.asarray(self.order(epoch))

    def batch(self, epoch: int, k: int) -> tuple[Array, Array]:
        """The k-th batch (x, y) of epoch `epoch`, gathered on the device."""
        idx = self.indices(epoch, k)
        xp = self.device.xp
        return xp.take(self.x, idx, axis=0), xp.take(self.y, idx, axis=0)

    def __iter__(self) -> Iterator[tuple[Array, Array]]:
        """The batches of epoch `self.epoch`; advances `self.epoch` at once, so a partial pass counts."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        return (self.batch(epoch, k) for k in range(len(self)))

    def __repr__(self) -> str:
        ranks = f", rank={self.rank} of {self.world}" if self.world > 1 else ""
        return (f"Loader(N={self.N}, batch_size={self.batch_size}{ranks}, batches={len(self)}, "
                f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, {self.device})")
