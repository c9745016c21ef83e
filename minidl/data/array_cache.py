"""A gzipped IDX file decoded once into a NumPy array file in minidl's cache, memory-mapped after that.

Decompressing and parsing MNIST's 47 MB of training images costs a warm process a few hundred
milliseconds each run (measured in docs/results.md, Time to accuracy); the same bytes as an .npy
file are mapped in a few. The cache is $MINIDL_CACHE/datasets/ (files.cache_dir), not the data
folder, which may be read-only (/usr/share/datasets). One cache file per source file, named

    <stem>-<hash of the source's absolute path>-<size>-<mtime in ns>-<CRC-32 of the payload>.npy

so a source that changes (its size or modification time) finds no file of its name and is decoded
again, the old file removed. A cache file is trusted only where it is a plain .npy of the dtype and
shape the source's header declares and its payload's CRC-32 is the one in its name; anything else
(truncated, a flipped byte, another array) is decoded again from the source and rewritten.
Written through the one writer (files.write_atomic: a temporary beside it, renamed), so a reader
never sees half a file. Where the cache cannot be written (a read-only home, a full disk, another
process writing it), the decoded array is used as before. $MINIDL_DATA_CACHE=off turns it off.
"""
from __future__ import annotations

import glob
import hashlib
import os
import zlib
import numpy as np

from .. import files
from .idx import GZIP_MAGIC, MAX_BYTES, read_header, read_idx

_NPY_MAGIC = b"\x93NUMPY"


def enabled() -> bool:
    """Whether the cache is used: unless $MINIDL_DATA_CACHE is off, 0, no or false."""
    return os.environ.get("MINIDL_DATA_CACHE", "").strip().lower() not in ("off", "0", "no", "false")


def folder() -> str:
    """Where decoded datasets go: <minidl's cache folder>/datasets."""
    return os.path.join(files.cache_dir(), "datasets")


def _prefix(path: str) -> str:
    """<stem>-<hash of the absolute path>-: every cache file of the source at `path`, whatever its version."""
    real = os.path.realpath(path)
    stem = os.path.basename(real).removesuffix(".gz")
    return f"{stem}-{hashlib.sha256(real.encode()).hexdigest()[:16]}-"


def _version(path: str) -> str:
    """<size>-<mtime in ns>: what changes when the source file is replaced or rewritten."""
    st = os.stat(path)
    return f"{st.st_size}-{st.st_mtime_ns}"


def crc(a: np.ndarray) -> str:
    """CRC-32 of the array's bytes in C order, 8 hex digits."""
    return f"{zlib.crc32(np.ascontiguousarray(a).data) & 0xFFFFFFFF:08x}"


def read(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """The array of the IDX file at `path` (idx.read_idx's, same checks): from the cache where the
    source is gzipped and a trusted cache file of its current version is there, else decoded and
    cached. A cached array is a copy-on-write map: writable, and writes never reach the file."""
    path = os.fspath(path)
    if not (enabled() and _gzipped(path)):
        return read_idx(path, max_bytes)
    dtype, dims = read_header(path)              # what the cache must hold (the source's own header)
    base = os.path.join(folder(), _prefix(path) + _version(path) + "-")
    for name in sorted(glob.glob(glob.escape(base) + "*.npy")):
        a = _trusted(name, dtype.newbyteorder("="), dims)
        if a is not None:
            return a
    a = read_idx(path, max_bytes)
    _store(path, base, a)
    return a


def _gzipped(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False                             # read_idx says what is wrong with it


def _trusted(name: str, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray | None:
    """The array in cache file `name`, mapped, if it is a .npy of `dtype` and shape `dims` whose
    payload's CRC-32 is the one in its name; else None (the file is removed: it is rebuilt)."""
    try:
        with open(name, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise ValueError("not an .npy file")
        a = np.load(name, mmap_mode="c", allow_pickle=False)
        if a.dtype != dtype or a.shape != tuple(dims) or crc(a) != name.rsplit("-", 1)[1].removesuffix(".npy"):
            raise ValueError("not the array its name says")
        return a.view(np.ndarray)                # a plain array to every reader, the map beneath it
    except (OSError, ValueError, EOFError):
        _remove(name)
        return None


def _store(path: str, base: str, a: np.ndarray) -> None:
    """Write `a` as the cache file of `path`'s current version; older versions' files go."""
    target = f"{base}{crc(a)}.npy"
    try:
        os.makedirs(folder(), exist_ok=True)
        files.write_atomic(target, lambda f: np.save(f, a, allow_pickle=False))
    except (OSError, ValueError):                # files.WriteError is a ValueError: the cache is an optimisation
        return
    for old in glob.glob(glob.escape(os.path.join(folder(), _prefix(path))) + "*.npy"):
        if old != target:
            _remove(old)


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass

