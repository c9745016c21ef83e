"""minidl.data: IDX validation, dataset lookup order, verified downloads, real MNIST, the Loader."""
import functools
import gzip
import hashlib
import http.server
import os
import threading

import numpy as np
import pytest

from minidl.backend import Device
from minidl.data import DataError, Loader, find_dataset, load, read_idx, write_idx
from minidl.data import datasets

STEMS = [s for split in datasets.FILES.values() for s in split]


def _sha(raw_bytes):
    return hashlib.sha256(raw_bytes).hexdigest()


def _raw(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if str(path).endswith(".gz") else data


def _make_dataset(folder, seed=0, gz=True, n=(6, 4)):
    """Write four small MNIST-shaped IDX files; return {stem: SHA-256 of the decompressed bytes}."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for (images, labels), count in zip(datasets.FILES.values(), n):
        for stem, a in ((images, rng.integers(0, 256, (count, 28, 28))), (labels, rng.integers(0, 10, count))):
            path = folder / (stem + (".gz" if gz else ""))
            write_idx(path, a.astype(np.uint8))
            hashes[stem] = _sha(_raw(path))
    return hashes


# ---- IDX reader ----

@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_idx_round_trip(tmp_path, suffix, dtype):
    a = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype) if dtype != "uint8" else \
        np.arange(30, dtype=np.uint8).reshape(2, 3, 5)
    write_idx(tmp_path / f"a{suffix}", a)
    b = read_idx(tmp_path / f"a{suffix}")
    assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)


def _write_raw(path, data):
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def _bad_idx(case):
    header = bytes([0, 0, 8, 2]) + (3).to_bytes(4, "big") + (4).to_bytes(4, "big")
    return {"truncated": header + bytes(11), "trailing": header + bytes(13),
            "wrong count": bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + bytes(4),
            "bad magic": bytes([0, 1, 8, 2]) + header[4:] + bytes(12),
            "bad type": bytes([0, 0, 7, 2]) + header[4:] + bytes(12),
            "short header": bytes([0, 0, 8, 3]) + (3).to_bytes(4, "big"),
            "tiny": b"\x00\x00"}[case]


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("case, words", [("truncated", "truncated"), ("trailing", "trailing"),
                                         ("wrong count", "truncated"), ("bad magic", "magic"),
                                         ("bad type", "magic"), ("short header", "header"),
                                         ("tiny", "header")])
def test_idx_rejects_bad_files_naming_file_and_fault(tmp_path, suffix, case, words):
    path = _write_raw(tmp_path / f"bad{suffix}", _bad_idx(case))
    with pytest.raises(DataError) as info:
        read_idx(path)
    msg = str(info.value)
    assert str(path) in msg and words in msg and "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_idx_rejects_truncated_gzip_stream_and_missing_file(tmp_path):
    write_idx(tmp_path / "a.gz", np.ones((50, 28, 28), np.uint8))
    data = (tmp_path / "a.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut.gz"):
        read_idx(tmp_path / "cut.gz")
    with pytest.raises(DataError, match="no such file"):
        read_idx(tmp_path / "missing")


# ---- lookup order ----

@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A cwd with no ./dataset, no $MINIDL_DATA, no system folder, no real mirrors."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIDL_DATA", raising=False)
    monkeypatch.delenv("MINIDL_MIRRORS", raising=False)
    monkeypatch.setattr(datasets, "SYSTEM_DIR", str(tmp_path / "system"))
    monkeypatch.setattr(datasets, "MIRRORS", {k: ("http://127.0.0.1:9/",) for k in datasets.MIRRORS})
    return tmp_path


def test_lookup_order_data_dir_then_env_then_cwd_then_system(isolated, monkeypatch):
    _make_dataset(isolated / "system" / "mnist")
    _make_dataset(isolated / "dataset" / "mnist", gz=False)
    _make_dataset(isolated / "env" / "mnist")
    _make_dataset(isolated / "arg" / "mnist")
    monkeypatch.setenv("MINIDL_DATA", str(isolated / "env"))
    assert find_dataset("mnist", isolated / "arg", download=False)[STEMS[0]].parent == isolated / "arg" / "mnist"
    assert find_dataset("mnist", download=False)[STEMS[0]].parent == isolated / "env" / "mnist"
    monkeypatch.delenv("MINIDL_DATA")
    assert find_dataset("mnist", download=False)[STEMS[0]] == isolated / "dataset" / "mnist" / STEMS[0]
    (isolated / "dataset").rename(isolated / "elsewhere")
    assert find_dataset("MNIST", download=False)[STEMS[0]].parent == isolated / "system" / "mnist"


def test_lookup_loose_files_in_root_must_match_the_dataset(isolated):
    hashes = _make_dataset(isolated / "flat")  # files directly in the root, not in flat/mnist/
    found = find_dataset("fashion_mnist", isolated / "flat", hashes=hashes, download=False)
    assert found[STEMS[1]] == isolated / "flat" / (STEMS[1] + ".gz")
    with pytest.raises(DataError, match="not found"):  # not Fashion-MNIST's labels: not taken for it
        find_dataset("fashion-mnist", isolated / "flat", download=False)
    with pytest.raises(ValueError, match="unknown dataset"):
        find_dataset("cifar10", download=False)


# ---- download ----

@pytest.fixture
def server(tmp_path, monkeypatch):
    """An HTTP server on 127.0.0.1 serving tmp_path/srv; yields (base url, folder)."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    root = tmp_path / "srv"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    httpd.shutdown()
    httpd.server_close()


def test_download_verifies_decompressed_hash_and_stores_raw(isolated, server, monkeypatch):
    url, root = server
    hashes = _make_dataset(root / "files")
    dead = url + "nothing-here/"  # a 404 mirror first: the next mirror must be tried
    found = find_dataset("mnist", isolated / "dl", mirrors=[dead, url + "files"], hashes=hashes)
    folder = isolated / "dl" / "mnist"
    assert sorted(os.listdir(folder)) == sorted(STEMS)  # raw files, no temporaries left
    for stem in STEMS:
        assert found[stem] == folder / stem and _sha(_raw(found[stem])) == hashes[stem]
    # $MINIDL_MIRRORS overrides the built-in list; the first writable root is $MINIDL_DATA
    monkeypatch.setenv("MINIDL_MIRRORS", f"{dead}, {url}files")
    monkeypatch.setenv("MINIDL_DATA", str(isolated / "env"))
    found = find_dataset("fashion-mnist", hashes=hashes, progress=False)
    assert found[STEMS[0]] == isolated / "env" / "fashion-mnist" / STEMS[0]


def test_download_checksum_mismatch_raises_and_leaves_nothing(isolated, server):
    url, root = server
    hashes = _make_dataset(root)
    hashes[STEMS[0]] = "0" * 64
    with pytest.raises(DataError, match="SHA-256") as info:
        find_dataset("mnist", isolated / "dl", mirrors=[url], hashes=hashes, progress=False)
    assert STEMS[0] in str(info.value) and "\n" not in str(info.value)
    assert os.listdir(isolated / "dl" / "mnist") == []


def test_load_validates_counts(isolated, monkeypatch):
    hashes = _make_dataset(isolated / "d" / "mnist", n=(6, 4))
    monkeypatch.setattr(datasets, "SIZES", {"train": 6, "test": 4})
    x, y = load("mnist", "train", isolated / "d", hashes=hashes)
    assert x.shape == (6, 28, 28) and x.dtype == np.uint8 and y.shape == (6,)
    monkeypatch.setattr(datasets, "SIZES", {"train": 6, "test": 5})
    with pytest.raises(DataError, match="expected 5"):
        load("mnist", "test", isolated / "d")
    write_idx(isolated / "d" / "mnist" / "t10k-labels-idx1-ubyte", np.zeros(3, np.uint8))  # raw beats .gz
    with pytest.raises(DataError, match="4 images but .* 3 labels"):
        load("mnist", "test", isolated / "d")


# ---- the real data ----

@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_dataset_loads_and_hashes_match(name):
    root = os.environ.get("MINIDL_DATA")
    if not root or not os.path.isdir(os.path.join(root, name)):
        pytest.skip(f"$MINIDL_DATA has no {name}/")
    paths = find_dataset(name, root, download=False)
    for stem, path in paths.items():
        assert _sha(_raw(path)) == datasets.SHA256[name][stem], path
    for split, n in (("train", 60000), ("test", 10000)):
        x, y = load(name, split, root)
        assert x.shape == (n, 28, 28) and y.shape == (n,) and x.dtype == y.dtype == np.uint8
        assert set(np.unique(y)) == set(range(10))


# ---- Loader ----

def _toy(n=103):
    images = (np.arange(n)[:, None, None] + np.zeros((1, 28, 28))).astype(np.uint8)
    return images, np.arange(n).astype(np.uint8)  # the label names the sample


def test_loader_covers_every_sample_once_with_short_last_batch():
    images, labels = _toy()
    loader = Loader(images, labels, 10, Device("cpu"), drop_last=False)
    batches = list(loader)
    assert len(loader) == len(batches) == 11 and len(batches[-1][1]) == 3
    y = np.concatenate([b[1] for b in batches])
    assert sorted(y) == list(range(103)) and y.dtype == np.int32
    x = np.concatenate([b[0] for b in batches])
    assert x.shape == (103, 1, 28, 28) and x.dtype == np.float32
    np.testing.assert_allclose(x[:, 0, 5, 5], (y / 255 - 0.1307) / 0.3081, rtol=1e-6)


def test_loader_drop_last_shapes_and_order_without_shuffle():
    images, labels = _toy()
    loader = Loader(images, labels, 10, Device("cpu", dtype="float64"), shuffle=False, normalize=False)
    batches = list(loader)
    assert len(loader) == len(batches) == 10 and all(len(y) == 10 for _, y in batches)
    assert np.array_equal(np.concatenate([y for _, y in batches]), np.arange(100))
    assert batches[0][0].dtype == np.float64 and batches[0][0].max() <= 1
    with pytest.raises(ValueError):
        Loader(images, labels[:-1], 10, Device("cpu"))


def test_loader_reshuffles_per_epoch_reproducibly_and_batch_matches_iteration():
    images, labels = _toy()
    a, b = (Loader(images, labels, 16, Device("cpu"), seed=7) for _ in range(2))
    epochs = [[y.tolist() for _, y in a] for _ in range(3)]
    assert a.epoch == 3 and epochs[0] != epochs[1] != epochs[2]
    assert [[y.tolist() for _, y in b] for _ in range(3)] == epochs  # same seed, same batches
    other = Loader(images, labels, 16, Device("cpu"), seed=8)
    assert [y.tolist() for _, y in other] != epochs[0]
    for e in range(3):  # any batch of any epoch can be rebuilt, in any order: resume mid-epoch
        for k in reversed(range(len(a))):
            x, y = a.batch(e, k)
            assert y.tolist() == epochs[e][k] and np.array_equal(x[:, 0, 0, 0], b.batch(e, k)[0][:, 0, 0, 0])
    b.epoch = 2
    assert [y.tolist() for _, y in b] == epochs[2]
    with pytest.raises(IndexError):
        a.batch(0, len(a))
