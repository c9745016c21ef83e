"""Batches made on the host at every step and copied to the device: what fit takes besides arrays.

`DatasetLoader` batches a map-style dataset (PyTorch's: `len(ds)`, `ds[i] -> (image, label)`) by
index, in the Loader's permutation of each epoch; `BatchLoader` reads an iterable or a generator of
`(x_batch, y_batch)` batches in order. Both hand batches to the training step as the Loader does
(`batch(epoch, k)`, `indices(epoch, k)`, `x`, `y`, `blank`), so the trainer and the captured step take
either: `indices` first copies batch k into the fixed device buffers `x`, `y` (B, C, H, W), (B,)
that a captured step reads, and returns the fixed indices 0..B-1. Each batch passes the input
contract on the host (uint8 0-255 or floats in [0, 1], docs/input.md), the user's `augment(x, y)`
first, then the layout (`layout`: NHWC to NCHW).
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np

from .checks import CLASSES, check_images, check_labels
from .errors import DataError
from .loader import background, batches_per_epoch, epoch_order, on_device, pixel_scale

if TYPE_CHECKING:
    from .._types import Array
    from ..backend import Device

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # minidl/


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel of the first frame outside minidl: the user's fit call, so the warning
    names the user's line, not this file (Python 3.12's skip_file_prefixes, on 3.10 too)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    return level


UNKNOWN = 1 << 62       # the steps of an epoch whose length only its end tells (a generator read once)
Augment = Callable[[np.ndarray, np.ndarray], "tuple[Any, Any]"]


class HostLoader:
    """What the two host loaders share: a host batch -> checked -> on the device, normalised.

    layout(x, where) -> x (N, C, H, W) or (N, H, W) (sources.layout); augment: the user's function
    of a host batch (x, y) -> (x, y), applied first, to the batch as the source holds it.
    """
    exhausted = False    # a stream of batches ran out: the trainer ends the run after this step

    def __init__(self, device: Device, *, normalize: bool | tuple[Any, Any] = True, classes: int = CLASSES,
                 layout: Callable[[np.ndarray, str], np.ndarray] = lambda x, where: x,
                 augment: Augment | None = None, training: bool = True, where: str = "fit") -> None:
        self.device, self.normalize, self.classes = device, normalize, classes
        self.layout, self.augment, self.training, self.where = layout, augment, training, where
        self.epoch = 0                    # the epoch the next `iter(loader)` runs
        self.blank = background(normalize, device.dtype)     # a background pixel's value once normalised
        self.x: Array | None = None       # the fixed device buffers a captured step reads
        self.y: Array | None = None
        self._staged: tuple[int, int] | None = None   # (epoch, k) of the batch in x, y
        self._arange: Array | None = None

    def host_batch(self, epoch: int, k: int) -> tuple[Any, Any]:
        """The raw k-th batch (images, labels) of epoch `epoch`, as the source gives it ((None, None): none
        for this rank)."""
        raise NotImplementedError

    def _checked(self, images: Any, labels: Any, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(images NCHW or NHW, labels, scale) of one host batch, through augment, layout and the checks."""
        if self.augment is not None:
            out = self.augment(np.asarray(images), np.asarray(labels))
            if not (isinstance(out, tuple) and len(out) == 2):
                raise DataError(f"{self.where}: augment must return a pair (x, y), got {type(out).__name__}")
            images, labels = out
        where = f"{self.where} batch {k}"
        images, labels = self.layout(np.asarray(images), where), np.asarray(labels)
        check_labels(labels, f"{where} labels", self.classes)
        check_images(images, labels, f"{where} images")
        return images, labels, pixel_scale(images, f"{where} images")

    def batch(self, epoch: int, k: int) -> tuple[Array, Array]:
        """The k-th batch (x, y) of epoch `epoch` on the device: x (B, C, H, W) device.dtype, y (B,) int32
        (both empty for a rank past the end of a last, partial batch, as the Loader's)."""
        images, labels = self.host_batch(epoch, k)
        if images is None:
            return self.device.xp.empty((0,), self.device.dtype), self.device.xp.empty((0,), np.int32)
        images, labels, scale = self._checked(images, labels, k)
        x, _ = on_device(images, scale, self.device, self.normalize)
        return x, self.device.asarray(labels, dtype=np.int32)

    def indices(self, epoch: int, k: int) -> Array:
        """Batch k of epoch `epoch` copied into the fixed buffers `x`, `y` (what a captured step
        reads); returns the fixed device indices 0..B-1 of that batch in them. Asking for the staged
        batch again copies nothing (the captured step's first call asks twice)."""
        if self._staged != (epoch, k):
            images, labels, scale = self._checked(*self.host_batch(epoch, k), k)
            if self.x is None:
                shape = images.shape if images.ndim == 4 else (len(images), 1, *images.shape[1:])
                self.x = self.device.xp.empty(shape, self.device.dtype)
                self.y = self.device.xp.empty(len(labels), np.int32)
                self._arange = self.device.asarray(np.arange(len(labels)))
            shape = images.shape if images.ndim == 4 else (len(images), 1, *images.shape[1:])
            if shape != self.x.shape:
                raise DataError(f"{self.where}: batch {k} holds images {shape}, the first {self.x.shape}: "
                                f"training steps take one batch shape")
            on_device(images, scale, self.device, self.normalize, out=self.x)
            self.device.xp.copyto(self.y, self.device.asarray(labels, dtype=np.int32))
            self._staged = (epoch, k)
        return self._arange

    def __iter__(self) -> Iterator[tuple[Array, Array]]:
        """The batches of epoch `self.epoch` (evaluation); advances `self.epoch` at once."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        for k in range(len(self)):
            if k and self.exhausted:
                return
            yield self.batch(epoch, k)

    def __len__(self) -> int:
        raise NotImplementedError


class Arrays:
    """(images, labels) arrays as a map-style dataset whose batches are gathered whole (fit's arrays
    with augment=, which runs on the host)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.images[i], self.labels[i]


class DatasetLoader(HostLoader):
    """A map-style dataset (`len(ds)`, `ds[i] -> (image, label)`) batched by index: epoch e visits
    the samples in the Loader's permutation (seeded with (seed, e)), so a resume continues exactly;
    ranks take their slice of each global batch as the Loader's do."""

    def __init__(self, dataset: Any, batch_size: int, device: Device, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True, rank: int = 0, world: int = 1, **how: Any) -> None:
        super().__init__(device, **how)
        self.dataset, self.N, self.batch_size = dataset, len(dataset), int(batch_size)
        self.shuffle, self.seed, self.drop_last, self.rank, self.world = shuffle, seed, drop_last, rank, world
        self.global_batch = self.batch_size * world
        if self.N == 0 or (drop_last and self.N < self.global_batch):
            raise DataError(f"{self.where}: a dataset of {self.N} samples gives no batch of {self.global_batch}")

    def __len__(self) -> int:
        return batches_per_epoch(self)

    def order(self, epoch: int) -> np.ndarray:
        """The Loader's: the host permutation of range(N) that epoch `epoch` visits."""
        return epoch_order(self, epoch)

    def host_batch(self, epoch: int, k: int) -> tuple[Any, Any]:
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range: an epoch has {len(self)} batches")
        start = k * self.global_batch + self.rank * self.batch_size
        idx = self.order(epoch)[start:start + self.batch_size]
        if len(idx) == 0:                   # a rank past the end of the last, partial batch (evaluation)
            return None, None
        if isinstance(self.dataset, Arrays):
            return self.dataset.images[idx], self.dataset.labels[idx]
        items = [self.dataset[int(i)] for i in idx]
        try:
            images, labels = zip(*items)
            return np.stack([np.asarray(a) for a in images]), np.asarray([np.asarray(b) for b in labels])
        except (TypeError, ValueError) as e:
            raise DataError(f"{self.where}: dataset items must be (image, label) pairs of one image shape "
                            f"({type(e).__name__}: {e})") from None


class BatchLoader(HostLoader):
    """An iterable or a generator of (x_batch, y_batch) batches, read in order.

    per_epoch: the steps of an epoch (Keras's steps_per_epoch; a re-iterable source's len(); UNKNOWN:
    one pass, ended by the source); steps: the run's, where known. A source that can be iterated
    again starts a new pass at each epoch, and where it runs out before the epoch's steps (more
    steps_per_epoch than a pass; a DataLoader whose smaller last batch is left out); a generator goes
    on where it stopped. Where a source that cannot start again runs out, `exhausted` turns True after
    the last step it fed and the trainer ends the run there (a warning where `steps` wanted more).
    Training takes one batch size, the first batch's: a smaller last batch of a pass is left out (as
    the Loader's drop_last); any other size is a DataError.
    """

    def __init__(self, source: Iterable[Any], device: Device, *, per_epoch: int = UNKNOWN, steps: int | None = None,
                 **how: Any) -> None:
        super().__init__(device, **how)
        self.source, self.per_epoch, self.steps = source, per_epoch, steps
        self.again = iter(source) is not source       # a list, a DataLoader: iter() starts a new pass
        self._it: Iterator[Any] | None = None if self.again else iter(source)
        self._ahead: list[Any] = []                  # batches read but not handed out (lookahead)
        self._pos: tuple[int, int] | None = None     # (epoch, k) of the last batch handed out
        self._last: Any = None
        self.batch_size = 0                           # the first batch's size
        self.read = 0                                 # batches handed out
        if self.training:                             # read now: its size is the run's, its faults said at once
            head = self._full()
            if head is None:
                raise DataError(f"{self.where}: the iterable gave no batch")
            self._ahead.append(head)

    def __len__(self) -> int:
        return self.per_epoch

    def _pull(self) -> Any:
        """The source's next batch (as a pair), or None at the end of its pass."""
        if self._it is None:
            self._it = iter(self.source)
        try:
            item = next(self._it)
        except StopIteration:
            self._it = None if self.again else self._it
            return None
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{self.where}: an iterable of batches must yield (x_batch, y_batch) pairs, "
                            f"got {type(item).__name__}")
        return item

    def _full(self) -> Any:
        """The next batch of the training batch size, or None where the pass ends (a smaller last
        batch left out); evaluation takes every batch as it comes."""
        item = self._ahead.pop(0) if self._ahead else self._pull()
        if item is None or not self.training:
            return item
        n = len(item[1]) if hasattr(item[1], "__len__") else 0
        self.batch_size = self.batch_size or n
        if n == self.batch_size:
            return item
        if n < self.batch_size and self._pull() is None:     # the pass's smaller last batch: left out
            return None
        raise DataError(f"{self.where}: a batch of {n} images among batches of {self.batch_size}: training steps "
                        f"take one batch size (only a pass's last batch may be smaller: it is left out)")

    def host_batch(self, epoch: int, k: int) -> Any:
        if self._pos == (epoch, k):
            return self._last
        if k == 0 and self.again and self.per_epoch != UNKNOWN and self._pos is not None:
            self._it, self._ahead = None, []           # a new epoch of a re-iterable source: a new pass
        item = self._full()
        if item is None and self.training and self.again and self.per_epoch != UNKNOWN and self.read:
            item = self._full()                         # steps_per_epoch beyond one pass: the next pass
        if item is None:
            raise DataError(f"{self.where}: the data ran out after {self.read} batches")
        self._pos, self._last, self.read = (epoch, k), item, self.read + 1
        if self.per_epoch == UNKNOWN or not self.again or (k + 1 < self.per_epoch):
            self._look_ahead(k)
        return item

    def _look_ahead(self, k: int) -> None:
        """Read the next batch now, so that the source's end is known after this step (`exhausted`)."""
        nxt = self._full()
        if nxt is not None:
            self._ahead.insert(0, nxt)
            return
        if self.again and self.per_epoch != UNKNOWN:      # the next step starts a new pass
            return
        self.exhausted = True
        if self.training and self.steps is not None and self.read < self.steps:
            warnings.warn(f"{self.where}: the data ran out after {self.read} batches, short of the {self.steps} "
                          f"steps asked: the run ends there", stacklevel=_user_stacklevel())
