"""The decoded data set cache (minidl/data/array_cache.py): a gzipped IDX file is decoded once into an
.npy in minidl's cache, mapped on later reads, rebuilt when the source changes, never trusted when corrupt."""
import glob
import os

import numpy as np
import pytest
from tests.test_cli import needs_mnist

from minidl import data
from minidl.data import array_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MINIDL_DATA_CACHE", raising=False)
    return tmp_path / "cache" / "datasets"


def source(tmp_path, seed=0, name="images-idx3-ubyte.gz"):
    a = np.random.default_rng(seed).integers(0, 256, (50, 28, 28), dtype=np.uint8)
    path = tmp_path / name
    data.write_idx(path, a)
    return path, a


def cached_files(cache):
    return sorted(glob.glob(str(cache / "*.npy")))


def no_decoding(monkeypatch):
    def decoded(*a, **k):
        raise AssertionError("the source was decoded again")
    monkeypatch.setattr(array_cache, "read_idx", decoded)


def test_decoded_once_then_read_from_the_cache(tmp_path, cache, monkeypatch):
    path, a = source(tmp_path)
    first = array_cache.read(path)
    assert np.array_equal(first, a) and len(cached_files(cache)) == 1
    no_decoding(monkeypatch)
    again = array_cache.read(path)
    assert np.array_equal(again, a) and type(again) is np.ndarray
    again[0, 0, 0] ^= 1                      # writable, and the write stays in this process
    assert np.array_equal(array_cache.read(path), a)
    assert len(cached_files(cache)) == 1


def test_a_changed_source_is_decoded_again_and_its_old_cache_goes(tmp_path, cache):
    path, a = source(tmp_path)
    array_cache.read(path)
    (old,) = cached_files(cache)
    _, b = source(tmp_path, seed=1)            # rewritten: same size, another mtime and payload
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    got = array_cache.read(path)
    assert np.array_equal(got, b) and not np.array_equal(got, a)
    (new,) = cached_files(cache)
    assert new != old and not os.path.exists(old)


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "not an npy", "another array"])
def test_a_corrupt_cache_file_is_rebuilt_not_trusted(tmp_path, cache, damage):
    path, a = source(tmp_path)
    array_cache.read(path)
    (name,) = cached_files(cache)
    raw = bytearray(open(name, "rb").read())
    if damage == "flip a payload byte":
        raw[-7] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    elif damage == "not an npy":
        raw = bytearray(b"garbage" * 100)
    with open(name, "wb") as f:
        if damage == "another array":
            np.save(f, np.zeros((50, 28, 27), np.uint8))
        else:
            f.write(raw)
    got = array_cache.read(path)
    assert np.array_equal(got, a)
    (rebuilt,) = cached_files(cache)
    assert np.array_equal(np.load(rebuilt), a)          # written again, whole


def test_raw_sources_and_a_cache_turned_off_write_nothing(tmp_path, cache, monkeypatch):
    raw, a = source(tmp_path, name="raw-idx3-ubyte")
    assert np.array_equal(array_cache.read(raw), a) and cached_files(cache) == []
    gz, b = source(tmp_path)
    monkeypatch.setenv("MINIDL_DATA_CACHE", "off")
    assert np.array_equal(array_cache.read(gz), b) and cached_files(cache) == []


def test_a_cache_that_cannot_be_written_leaves_the_decoded_array(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path / "a-file"))     # a file where the folder should be
    path, a = source(tmp_path)
    assert np.array_equal(array_cache.read(path), a)


def test_the_sources_checks_still_apply(tmp_path, cache):
    path, _ = source(tmp_path)
    with pytest.raises(data.DataError, match="more than the 100 allowed"):
        array_cache.read(path, max_bytes=100)
    assert cached_files(cache) == []


@needs_mnist
def test_mnist_loads_from_the_cache_on_the_second_read(cache, monkeypatch):
    images, labels = data.load("mnist", "test")
    assert len(cached_files(cache)) == 2           # images and labels
    no_decoding(monkeypatch)
    again = data.load("mnist", "test")
    assert np.array_equal(again[0], images) and np.array_equal(again[1], labels)
