"""What Trainer.fit and evaluate take as data, turned into one loader (`loader_for`).

Arrays `(images, labels)` (or images and labels apart) become a `Loader`: the whole set on the device,
batches gathered there (the fast path). A map-style dataset (`len(ds)`, `ds[i] -> (image, label)`,
what a PyTorch user has) and an iterable or a generator of `(x_batch, y_batch)` batches become a
host loader (data/host_loader.py): batches made on the host at each step and copied to the device.
Arrays with `augment=` (a host function) take that path too. A `Loader` passes as it is.

Images in NHWC are taken with `data_format="channels_last"` (Keras's name), or found where the shape
says so alone (the last axis 1 or 3, the model's channels, and not the NCHW shape); any other image
shape is one DataError naming both forms. `TrainLoaders` keeps fit's last array loader, one at
most, for the next fit on the same arrays: found by their contents (shape, dtype, CRC-32), so an
array changed in place is seen and nothing keeps old arrays alive.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import numpy as np

from .errors import DataError
from .host_loader import UNKNOWN, Arrays, Augment, BatchLoader, DatasetLoader, HostLoader
from .loader import Loader, Model, check_normalization, normalization

if TYPE_CHECKING:
    from ..backend import Device

FORMATS = ("channels_first", "channels_last")
FORMS = ("a Loader or a pair (images, labels) of arrays, images and labels apart, a map-style dataset (len(ds), "
         "ds[i] -> (image, label)), or an iterable or generator of (x_batch, y_batch) batches")


class NotData(DataError, TypeError):
    """What fit or evaluate cannot take as data: a TypeError, and a ValueError (DataError) as before."""


def layout(model: Model, data_format: str | None, where: str) -> Callable[[np.ndarray, str], np.ndarray]:
    """to_nchw(images, what): 4-D images as (N, C, H, W) for `model`'s input (C, H, W): NHWC moved to
    NCHW where data_format says 'channels_last', or where the shape says it alone; 3-D (N, H, W)
    images and other arrays pass (check_images and the model's input check name them)."""
    if data_format not in (None, *FORMATS):
        raise ValueError(f"{where}: data_format must be 'channels_first' or 'channels_last', got {data_format!r}")
    C, H, W = (tuple(model.inputs[0].shape[1:]) + (None, None, None))[:3]

    def to_nchw(images: np.ndarray, what: str) -> np.ndarray:
        if images.ndim != 4 or data_format == "channels_first" or None in (C, H, W):
            return images
        nchw, nhwc = images.shape[1:] == (C, H, W), images.shape[1:] == (H, W, C)
        if (data_format == "channels_last" and nhwc) or (data_format is None and nhwc and not nchw and C in (1, 3)):
            return np.ascontiguousarray(images.transpose(0, 3, 1, 2))    # (N, H, W, C) -> (N, C, H, W)
        if data_format is None and nchw:
            return images
        raise DataError(f"{what}: images of shape {images.shape}, but {model.name} takes (N, {C}, {H}, {W}) "
                        f"(channels first) or (N, {H}, {W}, {C}) with data_format='channels_last'")
    return to_nchw


def renamed(e: DataError, where: str) -> DataError:
    """The Loader's error as the entry point's: 'Loader images: ...' -> '{where} images: ...' (the user
    called fit or predict, not a Loader)."""
    msg = str(e)
    return DataError(f"{where} {msg[len('Loader '):]}" if msg.startswith("Loader ") else f"{where}: {msg}")


def _is_array(a: Any) -> bool:
    return isinstance(a, np.ndarray) or (hasattr(a, "__array__") and hasattr(a, "shape"))


def _is_pair_of_arrays(data: Any) -> bool:
    """(images, labels): a 2-tuple or list whose items are not themselves (x, y) batches."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        return False
    return not all(isinstance(d, (tuple, list)) and len(d) == 2 and not _is_array(d) for d in data)


def _label_ndim(data: Any, where: str) -> int:
    """The ndim of the label of a sized, indexable source's first item: 0 for a dataset of samples,
    1 for a sequence of batches."""
    try:
        item = data[0]
    except (KeyError, IndexError, TypeError):           # a mapping by names (a DataFrame): not by position
        raise NotData(f"{where}: {type(data).__name__}[0] is no item; pass {FORMS}") from None
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise DataError(f"{where}: a dataset's items must be (image, label) pairs, got {type(item).__name__}")
    return np.ndim(item[1])


def loader_for(x: Any, y: Any, model: Model, device: Device, *, where: str, batch_size: int, training: bool,
               seed: int = 0, rank: int = 0, world: int = 1, steps: int | None = None, epochs: int | None = None,
               steps_per_epoch: int | None = None, data_format: str | None = None, augment: Augment | None = None,
               fits: Callable[[int | None], None] = lambda top: None) -> Loader | HostLoader:
    """fit's or evaluate's data (x, and y where labels come apart, Keras's order) as one loader for
    `model` on `device`; `fits(top)`: the trainer's check of the labels against the model's output
    (called with the largest label, or None where labels come batch by batch)."""
    apart = _is_array(x) or isinstance(x, list)        # images, with their labels in y
    if y is not None and (isinstance(x, (Loader, HostLoader, tuple, dict)) or not apart):
        raise ValueError(f"{where}: labels given twice, or with data that holds them: pass {where}((images, labels)),"
                         f" {where}(images, labels) or {where}(data) for a dataset or batches")
    data = x if y is None else (x, y)
    if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch <= 0):
        raise ValueError(f"{where}: steps_per_epoch must be a positive int, got {steps_per_epoch!r}")
    if not callable(augment) and augment is not None:
        raise TypeError(f"{where}: augment must be a function of a host batch (x, y) -> (x, y), "
                        f"got {type(augment).__name__}")
    if isinstance(data, (Loader, HostLoader)):
        if data_format is not None or augment is not None or steps_per_epoch is not None:
            raise ValueError(f"{where}: data_format, augment and steps_per_epoch apply to the data fit makes a "
                             f"loader from, not to a {type(data).__name__}: pass the data itself")
        fits(data.label_max if isinstance(data, Loader) else None)
        check_normalization(model, data, where)   # type: ignore[arg-type]
        return data
    if isinstance(data, dict) or isinstance(data, (str, bytes)) or _is_array(data):
        what = "an array alone (no labels)" if _is_array(data) else type(data).__name__
        raise NotData(f"{where}: {what} is not data here; pass {FORMS}")
    how: dict[str, Any] = dict(normalize=normalization(model), classes=model.outputs[0].shape[-1], augment=augment,
                               layout=layout(model, data_format, where), training=training, where=where)
    fixed = "steps_per_epoch is for a source without len() (a generator); an epoch here is its whole set"
    if _is_pair_of_arrays(data):
        images, labels = np.asarray(data[0]), np.asarray(data[1])
        fits(int(labels.max()) if labels.size and labels.dtype.kind in "iu" else None)
        if steps_per_epoch is not None:
            raise ValueError(f"{where}: {fixed}")
        if augment is None:
            try:
                return Loader(how["layout"](images, f"{where} images"), labels, batch_size, device,
                              shuffle=training, seed=seed, drop_last=training, classes=how["classes"], rank=rank,
                              world=world, normalize=how["normalize"])
            except DataError as e:
                raise renamed(e, where) from None
        data = Arrays(images, labels)           # augment, then the layout, batch by batch on the host
    fits(None)
    if hasattr(data, "__len__") and len(data) == 0:
        raise DataError(f"{where}: the {type(data).__name__} holds no data")
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and (
            isinstance(data, Arrays) or _label_ndim(data, where) == 0):
        if steps_per_epoch is not None:
            raise ValueError(f"{where}: {fixed}")
        return DatasetLoader(data, batch_size, device, shuffle=training, seed=seed, drop_last=training, rank=rank,
                             world=world, **how)
    if not hasattr(data, "__iter__"):
        raise NotData(f"{where}: {type(data).__name__} is not data here; pass {FORMS}")
    per_epoch = _per_epoch(data, training, steps, epochs, steps_per_epoch, where)
    total = steps if steps is not None else None if per_epoch == UNKNOWN else (epochs or 1) * per_epoch
    return BatchLoader(cast(Iterable[Any], data), device, per_epoch=per_epoch, steps=total, **how)


def _per_epoch(source: Any, training: bool, steps: int | None, epochs: int | None, steps_per_epoch: int | None,
               where: str) -> int:
    """The steps of an epoch of an iterable of batches: steps_per_epoch, else its len() (less a smaller
    last batch that training leaves out, where the source can be indexed), else one pass (UNKNOWN):
    `steps` of it where given; more epochs than one then need steps_per_epoch (Keras's rule)."""
    if steps_per_epoch is not None:
        return steps_per_epoch
    try:
        n = len(source)
    except TypeError:
        n = None
    if n is not None:
        if training and n > 1 and hasattr(source, "__getitem__"):
            sizes = [np.shape(source[i][1])[:1] for i in (0, -1)]
            n -= sizes[1] != sizes[0]          # a smaller last batch: left out
        return n
    if not training:
        return UNKNOWN
    if epochs is not None and epochs > 1:
        raise ValueError(f"{where}: a {type(source).__name__} has no len(): epochs={epochs} needs steps_per_epoch= "
                         f"(the steps of an epoch), or give steps=")
    return UNKNOWN if steps is None else steps


def _fingerprint(a: np.ndarray) -> tuple[Any, ...]:
    """What tells an array's contents apart at a CRC-32's cost, a small part of a new Loader's
    (docs/input.md, Across fits): shape, dtype, checksum."""
    return a.shape, a.dtype.str, zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)


class TrainLoaders:
    """fit's loaders: the last one made from arrays is kept (one at most, holding the device copy, not
    the caller's arrays) and used again where the next fit brings the same contents and settings, so a
    captured step stays valid; arrays changed in place, or others, make a new one."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.loader: Loader | HostLoader | None = None

    def get(self, x: Any, y: Any, model: Model, device: Device, **how: Any) -> Loader | HostLoader:
        """loader_for's loader for training (its keywords), the last one where nothing differs."""
        pair = (x, y) if y is not None else x
        key = None
        if _is_pair_of_arrays(pair) and all(_is_array(a) for a in pair) and how.get("augment") is None:
            key = (*(_fingerprint(np.asarray(a)) for a in pair),
                   *sorted((k, v) for k, v in how.items() if k not in ("fits", "steps", "epochs")))
            if key == self.key and self.loader is not None:
                how["fits"](None)
                return self.loader
        self.key, self.loader = None, None            # the old loader goes before the new one is made
        loader = loader_for(x, y, model, device, training=True, **how)
        self.key, self.loader = key, loader if key is not None else None
        return loader
