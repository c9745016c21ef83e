"""MNIST and Fashion-MNIST: find the IDX files locally, else download, verify and store them.

An explicit `data_dir` is the only place looked at: it must exist and hold the files, and nothing
is downloaded into it (a mistyped path must fail, not be skipped or filled). Without it the lookup
roots are, in order: `$MINIDL_DATA`, `./dataset`, `/usr/share/datasets` (Debian's
dataset-fashion-mnist). In each root the four files may sit in `<root>/<name>/` or in the root
itself, gzipped or raw, under their standard names. If no root has them, they are downloaded from
public mirrors (or `$MINIDL_MIRRORS`, comma-separated base URLs) into `<root>/<name>/` of the first
writable of `$MINIDL_DATA`, `./dataset`, and stored decompressed once the SHA-256 of the
decompressed bytes matches: a file appears complete and verified, or not at all. Each file's size
is known (RAW_BYTES), so a download stops at it (a mirror streaming without end must not fill
the disk) and so does its decompression. A `$MINIDL_DATA` that is not a folder is skipped with one
warning (warnings.warn: the user's to fix).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import files
from . import array_cache
from .checks import check_labels
from .errors import DataError
from .idx import MAX_BYTES, open_maybe_gzip, read_header

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SIZES = {"train": 60000, "test": 10000}
SHAPE = (28, 28)
# SHA-256 of the DECOMPRESSED files: the .gz bytes differ between mirrors and gzip settings
SHA256 = {
    "mnist": {
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}
MIRRORS = {
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/",
              "https://storage.googleapis.com/cvdf-datasets/mnist/"),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}
SYSTEM_DIR = "/usr/share/datasets"
_CHUNK = 1 << 20
# Decompressed bytes of each file, both datasets alike: the IDX header, then one byte per pixel or label.
RAW_BYTES = {"train-images-idx3-ubyte": 16 + SIZES["train"] * SHAPE[0] * SHAPE[1],
             "train-labels-idx1-ubyte": 8 + SIZES["train"],
             "t10k-images-idx3-ubyte": 16 + SIZES["test"] * SHAPE[0] * SHAPE[1],
             "t10k-labels-idx1-ubyte": 8 + SIZES["test"]}
_warned: set[str] = set()


def download_cap(stem: str) -> int:
    """The most bytes a download of `stem`'s .gz may take: its decompressed size, plus what gzip adds
    to data it cannot compress (5 bytes a 16 KiB block) and its header; a server that decodes the
    gzip for us sends the decompressed size."""
    raw = RAW_BYTES.get(stem, MAX_BYTES)
    return raw + raw // 1000 + (64 << 10)


class _Capped:
    """A file that takes at most `cap` bytes: a download that goes past it stops with a DataError."""

    def __init__(self, f, cap, url):
        self.f, self.cap, self.url, self.n = f, cap, url, 0

    def write(self, chunk):
        self.n += len(chunk)
        if self.n > self.cap:
            raise DataError(f"{self.url}: sent more than {self.cap:,} bytes, more than the file can be: "
                            f"download stopped (a broken mirror?)")
        return self.f.write(chunk)

    def flush(self):
        self.f.flush()


def _env_root():
    """$MINIDL_DATA as a lookup root, or None where it is unset, or not a folder (said once)."""
    root = os.environ.get("MINIDL_DATA")
    if not root:
        return None
    if os.path.exists(root) and not os.path.isdir(root):
        if root not in _warned:
            _warned.add(root)
            warnings.warn(f"$MINIDL_DATA is {root}, which is not a folder: skipped (it should name the folder "
                          f"holding mnist/ and fashion-mnist/)", stacklevel=2)
        return None
    return root


def _canonical(name):
    key = name.lower().replace("_", "-")
    if key not in SHA256:
        raise ValueError(f"unknown dataset {name!r}: expected one of {sorted(SHA256)}")
    return key


def _copy_hash(src, out=None, limit=MAX_BYTES + _CHUNK, name=None):
    """SHA-256 of the decompressed contents of `src` (a path, or a descriptor the reading closes), also
    written to the binary file `out` if given; `name` names src in errors (default: src).

    Stops at `limit` decompressed bytes (above any real IDX file): a gzip bomb from a mirror or
    in a lookup root must not fill the disk or spin for minutes.
    """
    h, seen, name = hashlib.sha256(), 0, src if name is None else name
    try:
        with open_maybe_gzip(src) as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                seen += len(chunk)
                if seen > limit:
                    raise DataError(f"{name}: decompresses to more than {limit:,} bytes, "
                                    f"larger than any {'/'.join(SHA256)} file")
                h.update(chunk)
                if out is not None:
                    out.write(chunk)
    except (EOFError, zlib.error, OSError) as e:  # truncated or corrupt gzip, unreadable file
        raise DataError(f"{name}: unreadable ({e})") from None
    return h.hexdigest()


def sha256_of(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of the decompressed bytes of a gzipped or raw file."""
    return _copy_hash(path)


def _path(root):
    """Absolute, so the paths handed out survive a later chdir."""
    return Path(root).expanduser().absolute()


def _complete(folder, stems):
    """{stem: path} if all files are in `folder` (raw preferred: no decompression), else None."""
    paths = {}
    for stem in stems:
        found = [folder / f for f in (stem, stem + ".gz") if (folder / f).is_file()]
        if not found:
            return None
        paths[stem] = found[0]
    return paths


def _download_dir(name):
    for root in (_env_root(), "dataset"):
        if not root:
            continue
        folder = _path(root) / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise DataError(f"{name}: no writable download folder among $MINIDL_DATA, ./dataset")


def _mirror_list(name, mirrors):
    mirrors = mirrors or os.environ.get("MINIDL_MIRRORS") or MIRRORS[name]
    if isinstance(mirrors, str):
        mirrors = mirrors.split(",")
    return [m.strip() for m in mirrors if m.strip()]


def _fetch_verified(url, target, sha256, progress):
    """Download `url` (at most download_cap bytes) into an unnamed scratch file beside `target`, then
    write `target` through the one writer (files.write_atomic): the decompressed bytes (at most the
    file's known size), renamed into place only where their hash matches."""
    import pooch  # lazily: only downloads need it
    from tqdm.auto import tqdm

    with tempfile.TemporaryFile(dir=target.parent) as scratch:     # no name: nothing left behind
        # total=1 until pooch sets the Content-Length: pooch tests `if bar`, and tqdm's bool()
        # raises while total is None
        bar = tqdm(desc=target.name, total=1, unit="B", unit_scale=True) if progress else False
        try:
            pooch.HTTPDownloader(progressbar=bar)(url, _Capped(scratch, download_cap(target.name), url), None)
        finally:
            if progress:
                bar.close()
        scratch.flush()
        scratch.seek(0)

        def fill(f):
            # by content, not name: a server sending Content-Encoding: gzip hands us raw bytes
            got = _copy_hash(os.dup(scratch.fileno()), f, RAW_BYTES.get(target.name, MAX_BYTES + _CHUNK), url)
            if got != sha256:
                raise DataError(f"{url}: SHA-256 of the decompressed data is {got}, expected {sha256}")
        files.write_atomic(target, fill)


def _turn(target):
    """One process at a time fetches `target` (files.exclusive, on a lock in the per-user lock folder,
    keyed by the path: none is left in the data folder); unlocked where there is no such folder."""
    lock = files.key_lock_path(f"{target}.download")
    return files.exclusive(lock) if lock else contextlib.nullcontext()


def _download(stem, folder, mirrors, sha256, progress):
    errors = []
    for base in mirrors:
        url = f"{base.rstrip('/')}/{stem}.gz"
        try:
            return _fetch_verified(url, folder / stem, sha256, progress)
        except Exception as e:  # noqa: BLE001 (network errors come in many types; try the next mirror)
            why = str(e) if isinstance(e, DataError) else f"{url}: {e}"  # DataError names the url
            errors.append(" ".join(why.split()))  # keep the final message on one line
    raise DataError(f"{folder / stem}: download failed from every mirror ({'; '.join(errors)}); "
                    f"place the files under a lookup root or set $MINIDL_MIRRORS")


def _explicit_root(data_dir, name):
    """The one root an explicit `data_dir` names; it must be an existing folder."""
    root = _path(data_dir)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(f"data_dir {root} {what}: it should hold {name}/{FILES['train'][0]}[.gz] "
                        f"and the other three {name} IDX files, or hold them directly")
    return root


def find_dataset(name: str, data_dir: str | os.PathLike | None = None, mirrors: str | Sequence[str] | None = None,
                 hashes: dict[str, str] | None = None, download: bool = True,
                 progress: bool = True) -> dict[str, Path]:
    """{standard file name: Path} of the four IDX files of `name`, found locally or downloaded.

    An explicit `data_dir` is searched alone and never downloaded into (see the module docstring).
    `mirrors` (list or comma-separated base URLs) and `hashes` ({file name: SHA-256 of the
    decompressed bytes}) override the built-in tables; tests use them to serve their own files.
    """
    name = _canonical(name)
    hashes = hashes or SHA256[name]
    stems = [stem for split in FILES.values() for stem in split]
    if data_dir is not None:
        roots = [_explicit_root(data_dir, name)]
    else:
        roots = [_path(r) for r in (_env_root(), "dataset", SYSTEM_DIR) if r]
    for root in roots:
        found = _complete(root / name, stems)
        if found:
            return found
        # files loose in a root could be either dataset: the small label files tell them apart
        found = _complete(root, stems)
        if found and all(sha256_of(found[s]) == hashes[s] for s in stems if "labels" in s):
            return found
    if not download or data_dir is not None:
        raise DataError(f"{name}: {FILES['train'][0]} and the other IDX files not found in "
                        f"{' or '.join(map(str, roots))} (as {name}/<file> or <file>, .gz or raw)"
                        + ("; not downloading into an explicit data_dir" if download else ""))
    folder = _download_dir(name)
    mirrors = _mirror_list(name, mirrors)
    for stem in stems:
        with _turn(folder / stem):      # another process downloading it (a rank): waited for, then found
            if _complete(folder, [stem]) is None:
                _download(stem, folder, mirrors, hashes[stem], progress)
    return _complete(folder, stems)


def _check_headers(split, ipath, lpath):
    """Validate what the two files declare before reading a byte of payload; returns N."""
    (idt, idims), (ldt, ldims) = read_header(ipath), read_header(lpath)
    if idt != np.uint8 or len(idims) != 3 or idims[1:] != SHAPE:
        raise DataError(f"{ipath}: images of shape {idims} {idt.name}, expected (N, 28, 28) uint8")
    if ldt != np.uint8 or len(ldims) != 1:
        raise DataError(f"{lpath}: labels of shape {ldims} {ldt.name}, expected (N,) uint8")
    if idims[0] != ldims[0]:
        raise DataError(f"{ipath}: {idims[0]} images but {lpath.name} has {ldims[0]} labels")
    if idims[0] != SIZES[split]:
        raise DataError(f"{ipath}: {idims[0]} items, expected {SIZES[split]} for {split!r}")
    return idims[0]


def load(name: str, split: str = "train", data_dir: str | os.PathLike | None = None,
         **find_kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels uint8 (N,)) of one split, N = 60000 train / 10000 test."""
    if split not in FILES:
        raise ValueError(f"unknown split {split!r}: expected 'train' or 'test'")
    paths = find_dataset(name, data_dir, **find_kw)
    ipath, lpath = (paths[stem] for stem in FILES[split])
    N = _check_headers(split, ipath, lpath)
    # exact bounds (the headers passed: a file swapped since cannot grow past them); decoded once, mapped after
    images, labels = array_cache.read(ipath, max_bytes=N * SHAPE[0] * SHAPE[1]), array_cache.read(lpath, max_bytes=N)
    check_labels(labels, lpath)
    return images, labels


def mnist(split: str = "train", data_dir: str | os.PathLike | None = None,
          **find_kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """MNIST digits: (images uint8 (N, 28, 28), labels uint8 (N,))."""
    return load("mnist", split, data_dir, **find_kw)


def fashion_mnist(split: str = "train", data_dir: str | os.PathLike | None = None,
                  **find_kw: Any) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST clothing: (images uint8 (N, 28, 28), labels uint8 (N,))."""
    return load("fashion-mnist", split, data_dir, **find_kw)
