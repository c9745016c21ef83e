"""Data: the IDX reader, MNIST / Fashion-MNIST (lookup, download, verify) and the device batch loader."""
from __future__ import annotations

from .errors import DataError
from .idx import read_idx, write_idx
from .datasets import SHA256, find_dataset, load, mnist, fashion_mnist, sha256_of
from .loader import Loader

DATASETS: tuple[str, ...] = tuple(SHA256)        # the names find_dataset and load take

__all__ = ["DATASETS", "DataError", "read_idx", "write_idx", "find_dataset", "load", "mnist", "fashion_mnist",
           "sha256_of", "Loader"]
