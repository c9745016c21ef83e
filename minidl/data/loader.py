"""Mini-batches of a whole dataset held on the device, reshuffled every epoch by a seeded generator."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from .checks import CLASSES, check_images, check_labels
from .errors import DataError

if TYPE_CHECKING:
    from .._types import Array
    from ..backend import Device

# MNIST's pixel mean and standard deviation after scaling to [0, 1] (the usual torchvision values)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CONTRACT = "uint8 in [0, 255] or floating point in [0, 1] (docs/input.md)"


def pixel_scale(images: np.ndarray, where: str = "images") -> int:
    """What the images are divided by to lie in [0, 1]: 255 for uint8, 1 for floating images in [0, 1].

    The one input contract of Loader (so of Trainer.fit and evaluate), docs/input.md. Anything else is
    a DataError (a ValueError) naming the range or dtype found: 0-255 floats would train on pixels 255x
    too bright, [0, 1] floats taken for uint8 were divided by 255 twice (11% after 500 steps), and data
    normalised before would be normalised again. Integers other than uint8 and booleans are refused:
    their dtype does not say which scale they use. NaN passes, as a training loss stops on it.
    """
    if images.dtype == np.uint8:
        return 255
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"{where}: dtype {images.dtype}, expected {CONTRACT}")
    lo, hi = float(np.nanmin(images)), float(np.nanmax(images))     # one pass each, on the host
    if lo < 0 or hi > 1:
        why = ("infinite values" if np.isinf(lo) or np.isinf(hi) else
               "0-255 values? divide them by 255, or pass uint8" if lo >= 0 and hi <= 255 else
               "normalised already? pass the [0, 1] images: the Loader normalises (normalize=)")
        raise DataError(f"{where}: {images.dtype} values in [{lo:.4g}, {hi:.4g}], expected {CONTRACT}; {why}")
    return 1


class Loader:
    """Batches (x, y) of images (N, H, W) or (N, C, H, W) -> x (B, C, H, W) device.dtype, y (B,) int32.

    Images are uint8 in [0, 255] or floating point in [0, 1] (pixel_scale; docs/input.md): a float
    image equal to uint8/255 gives the same batches, to the rounding of x's dtype. The whole set is
    copied to the device once: x = (images/scale - 0.1307) / 0.3081 when `normalize` is True
    (MNIST's mean/std; pass a (mean, std) pair for other data, False for plain [0, 1]).
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
                 normalize: bool | tuple[float, float] = True, classes: int = CLASSES, rank: int = 0,
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
        xp = device.xp
        shape = images.shape if images.ndim == 4 else (self.N, 1, *images.shape[1:])
        # uint8 travels to the device (4x less than float32) and is converted there; floats travel in
        # the device's dtype. astype copies, so the in-place steps below never touch the caller's array
        if scale == 1 and images.dtype != device.dtype:
            images = images.astype(device.dtype)
        x = xp.asarray(images).reshape(shape).astype(device.dtype)  # (N, C, H, W)
        if scale != 1:
            x /= scale
        self.blank = 0.0  # what a 0 (background) pixel becomes: the fill of shifted images
        if normalize is not False:
            mean, std = (MNIST_MEAN, MNIST_STD) if normalize is True else normalize
            x -= mean
            x /= std
            self.blank = float((device.dtype.type(0) - mean) / std)     # in x's dtype, as x was
        self.x, self.y = x, device.asarray(labels, dtype=np.int32)
        self._order: tuple[int | None, Array] = (None, None)  # (epoch, device index array): for batch() calls

    def __len__(self) -> int:
        """Batches per epoch (global batches: every rank runs as many)."""
        full, rest = divmod(self.N, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """Host int64 permutation of range(N) that epoch `epoch` visits."""
        if not self.shuffle:
            return np.arange(self.N)
        return np.random.default_rng([self.seed, epoch]).permutation(self.N)

    def indices(self, epoch: int, k: int) -> Array:
        """The device indices of this rank's part of the k-th batch of epoch `epoch` (a view: no
        copy, no transfer); empty for a rank past the end of a last, partial batch."""
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range: an epoch has {len(self)} batches")
        if self._order[0] != epoch:
            self._order = (epoch, self.device.asarray(self.order(epoch)))  # one transfer per epoch
        start = k * self.global_batch + self.rank * self.batch_size
        return self._order[1][start:start + self.batch_size]

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
