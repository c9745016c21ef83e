"""Data: the IDX reader, MNIST / Fashion-MNIST (lookup, download, verify) and the device batch loader."""
from .errors import DataError
from .idx import read_idx, write_idx
from .datasets import find_dataset, load, mnist, fashion_mnist, sha256_of
from .loader import Loader

__all__ = ["DataError", "read_idx", "write_idx", "find_dataset", "load", "mnist", "fashion_mnist",
           "sha256_of", "Loader"]
