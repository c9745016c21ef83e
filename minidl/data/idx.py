"""IDX files (the MNIST format): a validating reader and a writer, gzipped or raw.

Layout: two zero bytes, a type code, the number of dimensions D, then D big-endian uint32 sizes,
then the payload in C order, big-endian. See http://yann.lecun.com/exdb/mnist/.
"""
import contextlib
import gzip
import math
import struct
import zlib

import numpy as np

from .errors import DataError

# IDX type code -> NumPy dtype of the (big-endian) payload
TYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
         0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def open_maybe_gzip(path):
    """Open `path` for binary reading, decompressing on the fly if it is gzip (by content, not name)."""
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not gz:
            yield f
            return
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
            yield g


def read_idx(path):
    """Read an IDX file (gzipped or raw) into a NumPy array of shape dims, native byte order."""
    try:
        with open_maybe_gzip(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip stream
        raise DataError(f"{path}: unreadable gzip data ({e})") from None
    if len(data) < 4:
        raise DataError(f"{path}: {len(data)} bytes, too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or code not in TYPES:
        raise DataError(f"{path}: bad magic number 0x{data[:4].hex()}, expected 0x0000TTDD with "
                        f"type TT in {{{', '.join(f'{c:02x}' for c in TYPES)}}}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated header: {ndim} dimensions need {header} bytes, "
                        f"file has {len(data)}")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = TYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    got = len(data) - header
    if got != expected:
        what = "truncated" if got < expected else "trailing bytes"
        raise DataError(f"{path}: {what}: payload is {got} bytes, expected {expected} for shape "
                        f"{dims} of {dtype.name}")
    # copy into native byte order so the result is writable and fast to compute on
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path, array):
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
