"""IDX files (the MNIST format): a validating, memory-bounded reader and a writer, gzipped or raw.

Layout: two zero bytes, a type code, the number of dimensions D, then D big-endian uint32 sizes,
then the payload in C order, big-endian. See http://yann.lecun.com/exdb/mnist/.

The reader trusts nothing: it reads the header first, refuses a payload larger than `max_bytes`
before allocating it, then decompresses exactly the declared bytes plus one (to detect trailing
data). A gzip bomb therefore costs at most `max_bytes` of memory and a few reads, whatever it holds.
"""
from __future__ import annotations

import contextlib
import gzip
import math
import os
import struct
import zlib
from typing import IO, Iterator

import numpy as np

from .errors import DataError

# IDX type code -> NumPy dtype of the (big-endian) payload
TYPES: dict[int, np.dtype] = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
         0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
GZIP_MAGIC = b"\x1f\x8b"
# the largest payload read_idx allocates unless told otherwise: MNIST's 60000x28x28 is 47 MB
MAX_BYTES = 64 << 20
_CHUNK = 1 << 20


@contextlib.contextmanager
def open_maybe_gzip(path: str | os.PathLike) -> Iterator[IO[bytes] | gzip.GzipFile]:
    """Open `path` for binary reading, decompressing on the fly if it is gzip (by content, not name)."""
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not gz:
            yield f
            return
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            yield g


@contextlib.contextmanager
def _reading(path):
    """open_maybe_gzip with every way a file can fail to read turned into one DataError line."""
    try:
        with open_maybe_gzip(path) as f:
            yield f
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not an IDX file") from None
    except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip stream, unreadable file
        raise DataError(f"{path}: unreadable ({' '.join(str(e).split())})") from None


def _read_exactly(f, n):
    """Up to n bytes from the stream; fewer only at its end (a gzip read may return short)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:got + _CHUNK])
        if not k:
            break
        got += k
    return buf, got


def _header(f, path):
    head, got = _read_exactly(f, 4)
    if got < 4:
        raise DataError(f"{path}: {got} bytes, too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", head)
    if zero != 0 or code not in TYPES:
        raise DataError(f"{path}: bad magic number 0x{bytes(head).hex()}, expected 0x0000TTDD with "
                        f"type TT in {{{', '.join(f'{c:02x}' for c in TYPES)}}}")
    sizes, got = _read_exactly(f, 4 * ndim)
    if got < 4 * ndim:
        raise DataError(f"{path}: truncated header: {ndim} dimensions need {4 + 4 * ndim} bytes, "
                        f"file has {4 + got}")
    return TYPES[code], struct.unpack(f">{ndim}I", sizes)


def read_header(path: str | os.PathLike) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, dims) that an IDX file declares, read without touching its payload."""
    with _reading(path) as f:
        return _header(f, path)


def read_idx(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """Read an IDX file (gzipped or raw) into a NumPy array of shape dims, native byte order.

    Raises DataError if the declared payload exceeds `max_bytes` or the file holds more or less.
    """
    with _reading(path) as f:
        dtype, dims = _header(f, path)
        expected = math.prod(dims) * dtype.itemsize
        if expected > max_bytes:
            raise DataError(f"{path}: header declares shape {dims} of {dtype.name}, {expected:,} "
                            f"bytes, more than the {max_bytes:,} allowed")
        buf, got = _read_exactly(f, expected)
        if got == expected:
            got += len(f.read(1))  # one byte more, not the rest: the rest may be a gzip bomb
    if got != expected:
        what = "truncated" if got < expected else "trailing bytes"
        size = f"{got}" if got < expected else f"more than {expected}"
        raise DataError(f"{path}: {what}: payload is {size} bytes, expected {expected} for shape "
                        f"{dims} of {dtype.name}")
    a = np.frombuffer(buf, dtype).reshape(dims)  # writable: it views our bytearray
    if not dtype.isnative:  # swap in place: a copy would double the peak memory
        a = a.byteswap(inplace=True).view(dtype.newbyteorder("="))
    return a


def write_idx(path: str | os.PathLike, array: np.typing.ArrayLike) -> None:
    """Write `array` as an IDX file; gzipped if `path` ends in .gz (fixed mtime: same bytes each time)."""
    a = np.asarray(array)
    codes = {dt.newbyteorder("="): c for c, dt in TYPES.items()}
    if a.dtype.newbyteorder("=") not in codes:
        raise ValueError(f"IDX cannot store dtype {a.dtype}: expected one of "
                         f"{sorted(dt.name for dt in codes)}")
    code = codes[a.dtype.newbyteorder("=")]
    header = struct.pack(f">HBB{a.ndim}I", 0, code, a.ndim, *a.shape)
    payload = np.ascontiguousarray(a, dtype=TYPES[code]).tobytes()
    if str(path).endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(header + payload)
    else:
        with open(path, "wb") as f:
            f.write(header + payload)
