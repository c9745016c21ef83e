"""Checks on (images, labels) where they enter minidl: files in datasets.load, arrays in Loader."""
from __future__ import annotations

import os

import numpy as np

from .errors import DataError

CLASSES = 10


def check_labels(labels: np.ndarray, where: str | os.PathLike, classes: int = CLASSES, hint: str = "") -> None:
    """Raise DataError unless `labels` is a 1-D integer array with values in [0, classes).

    Checked once on entry: a -1 would otherwise index class 9 and a 15 fail deep in the loss.
    """
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: labels of shape {labels.shape} {labels.dtype}, expected (N,) integers")
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if len(bad):
        raise DataError(f"{where}: label {labels[bad[0]]} at index {bad[0]} is out of range "
                        f"0-{classes - 1} ({len(bad)} such labels){hint}")


def check_images(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    """Raise DataError unless `images` is (N, H, W) or (N, C, H, W) numbers, one per label."""
    if images.ndim not in (3, 4) or not (np.issubdtype(images.dtype, np.number) or images.dtype == bool):
        raise DataError(f"{where}: images of shape {images.shape} {images.dtype}, expected "
                        f"(N, H, W) or (N, C, H, W) numbers")
    if len(images) != len(labels):
        raise DataError(f"{where}: {len(images)} images but {len(labels)} labels")
    if len(images) == 0:
        raise DataError(f"{where}: no images")
