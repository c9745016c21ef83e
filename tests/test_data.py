"""minidl.data: IDX validation, dataset lookup order, verified downloads, real MNIST, the Loader."""
import functools
import gzip
import hashlib
import http.server
import os
import struct
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

from minidl.backend import Device
from minidl.data import DataError, Loader, find_dataset, load, read_idx, write_idx
from minidl.data import datasets
from minidl.data.idx import MAX_BYTES

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


def _gzip_bomb(path, header, payload, extra_zeros):
    """header + payload + `extra_zeros` zero bytes, gzipped as repeated members: tiny on disk."""
    zeros = gzip.compress(bytes(64 << 20), compresslevel=1)  # one 64 MiB member, reused
    with open(path, "wb") as f:
        f.write(gzip.compress(header + payload, compresslevel=1))
        for _ in range(extra_zeros // (64 << 20)):
            f.write(zeros)
    return path


def _header(code, *dims):
    return struct.pack(f">HBB{len(dims)}I", 0, code, len(dims), *dims)


def test_idx_header_declaring_a_huge_payload_is_refused_before_reading(tmp_path):
    path = _write_raw(tmp_path / "huge.gz", _header(8, 2**32 - 1, 28, 28) + bytes(100))
    with pytest.raises(DataError, match="more than the .* allowed") as info:
        read_idx(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    write_idx(tmp_path / "ok", np.zeros((3, 4), np.int32))  # 48 bytes: a bound of 47 refuses it
    with pytest.raises(DataError, match="48 bytes"):
        read_idx(tmp_path / "ok", max_bytes=47)
    assert read_idx(tmp_path / "ok", max_bytes=48).shape == (3, 4)


def test_idx_gzip_bomb_after_a_valid_header_fails_in_bounded_memory(tmp_path):
    # MNIST's train images, then 1 GiB of zeros in a 5 MB file: reading it all would take 1 GiB
    bomb = _gzip_bomb(tmp_path / "train-images-idx3-ubyte.gz", _header(8, 60000, 28, 28),
                      bytes(60000 * 28 * 28), 1 << 30)
    assert bomb.stat().st_size < 8 << 20
    # a fresh process, so its peak RSS is this read's alone (the test process has seen more)
    script = textwrap.dedent(f"""
        import resource
        from minidl.data import DataError, read_idx
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            read_idx({str(bomb)!r})
        except DataError as e:
            print(e)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    message, grown_mib = p.stdout.splitlines()
    assert str(bomb) in message and "trailing bytes" in message, p.stderr
    assert int(grown_mib) < 150, f"peak RSS grew by {grown_mib} MiB"  # the 45 MiB payload, not 1 GiB


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


def test_explicit_data_dir_is_used_alone_and_must_exist(isolated, monkeypatch):
    _make_dataset(isolated / "env" / "mnist")
    monkeypatch.setenv("MINIDL_DATA", str(isolated / "env"))  # would be found: must not be used
    missing = isolated / "typo"
    with pytest.raises(DataError) as info:
        find_dataset("mnist", missing)
    assert str(missing) in str(info.value) and "does not exist" in str(info.value)
    assert not missing.exists() and not (isolated / "dataset").exists()  # nothing created
    (isolated / "file").write_text("")
    with pytest.raises(DataError, match=f"{isolated / 'file'} is not a folder"):
        load("mnist", "train", isolated / "file")


def test_explicit_data_dir_without_the_files_never_downloads(isolated, server):
    url, root = server
    hashes = _make_dataset(root)  # a working mirror: only the rule keeps it from being used
    (isolated / "empty").mkdir()
    with pytest.raises(DataError, match="not downloading into an explicit data_dir") as info:
        find_dataset("mnist", isolated / "empty", mirrors=[url], hashes=hashes, progress=False)
    assert str(isolated / "empty") in str(info.value) and STEMS[0] in str(info.value)
    assert os.listdir(isolated / "empty") == [] and not (isolated / "dataset").exists()
    # a data_dir naming the dataset folder itself holds the files loose: found, not re-nested
    _make_dataset(isolated / "d" / "mnist")
    found = find_dataset("mnist", isolated / "d" / "mnist", hashes=hashes, download=False)
    assert found[STEMS[0]].parent == isolated / "d" / "mnist"


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
    found = find_dataset("mnist", mirrors=[dead, url + "files"], hashes=hashes)
    folder = isolated / "dataset" / "mnist"  # no $MINIDL_DATA: the default place is ./dataset
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
        find_dataset("mnist", mirrors=[url], hashes=hashes, progress=False)
    assert STEMS[0] in str(info.value) and "\n" not in str(info.value)
    assert os.listdir(isolated / "dataset" / "mnist") == []


def test_download_of_a_gzip_bomb_stops_at_the_size_limit(isolated, server):
    url, root = server
    _gzip_bomb(root / (STEMS[0] + ".gz"), _header(8, 60000, 28, 28), b"", MAX_BYTES + (64 << 20))
    with pytest.raises(DataError, match="decompresses to more than") as info:
        find_dataset("mnist", mirrors=[url], hashes={s: "0" * 64 for s in STEMS}, progress=False)
    assert "\n" not in str(info.value)
    assert os.listdir(isolated / "dataset" / "mnist") == []  # no partial file, no temporaries


@pytest.fixture
def endless(monkeypatch):
    """A mirror on 127.0.0.1 that streams zeros without end (no Content-Length); yields its base url
    and the bytes it sent (issue 38.6: such a mirror must not fill the disk)."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    sent = [0]

    class Zeros(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            chunk = bytes(1 << 16)
            try:
                while sent[0] < (1 << 30):                  # 1 GiB at most, should the cap fail
                    self.wfile.write(chunk)
                    sent[0] += len(chunk)
            except OSError:                                 # the client stopped reading
                pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Zeros)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", sent
    httpd.shutdown()
    httpd.server_close()


def test_a_download_stops_at_the_files_known_size(isolated, endless, monkeypatch):
    url, sent = endless
    monkeypatch.setitem(datasets.RAW_BYTES, STEMS[0], 1 << 20)      # a 1 MiB file, so the test is quick
    cap = datasets.download_cap(STEMS[0])
    with pytest.raises(DataError, match=rf"sent more than {cap:,} bytes, more than the file can be") as info:
        find_dataset("mnist", mirrors=[url], progress=False)
    assert "\n" not in str(info.value) and url in str(info.value)
    assert os.listdir(isolated / "dataset" / "mnist") == []          # no partial file, no temporaries
    assert sent[0] < cap + (16 << 20)                                # stopped within the socket's buffers
    assert datasets.download_cap("train-images-idx3-ubyte") < 48 * 10 ** 6     # the real cap: 47 MB


def test_minidl_data_naming_a_file_is_skipped_with_one_warning(isolated, monkeypatch):
    (isolated / "afile").write_text("")
    hashes = _make_dataset(isolated / "dataset" / "mnist")
    monkeypatch.setenv("MINIDL_DATA", str(isolated / "afile"))
    monkeypatch.setattr(datasets, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")                      # once all the same: the module remembers the root
        for _ in range(2):
            found = find_dataset("mnist", hashes=hashes)["t10k-labels-idx1-ubyte"]
            assert found.parent == isolated / "dataset" / "mnist"
    assert [str(w.message) for w in caught] == [
        f"$MINIDL_DATA is {isolated / 'afile'}, which is not a folder: skipped (it should name the folder holding "
        f"mnist/ and fashion-mnist/)"]
    assert caught[0].category is UserWarning


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


def test_load_checks_declared_shapes_before_reading_payloads(isolated, monkeypatch):
    hashes = _make_dataset(isolated / "d" / "mnist")
    monkeypatch.setattr(datasets, "SIZES", {"train": 6, "test": 4})
    folder = isolated / "d" / "mnist"
    # a bomb in place of the test images: its header alone condemns it, so it is never inflated
    path = _gzip_bomb(folder / "t10k-images-idx3-ubyte", _header(8, 4, 2**16, 2**16), b"", 0)
    with pytest.raises(DataError, match=r"\(4, 65536, 65536\) uint8, expected \(N, 28, 28\)") as info:
        load("mnist", "test", isolated / "d", hashes=hashes)
    assert str(path) in str(info.value)
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((4, 28, 28), np.float32))
    with pytest.raises(DataError, match="float32, expected"):
        load("mnist", "test", isolated / "d")


@pytest.mark.parametrize("bad", [10, 255])
def test_load_rejects_labels_out_of_range_naming_the_file(isolated, monkeypatch, bad):
    _make_dataset(isolated / "d" / "mnist")
    monkeypatch.setattr(datasets, "SIZES", {"train": 6, "test": 4})
    labels = np.array([0, 9, bad, 3], np.uint8)
    path = isolated / "d" / "mnist" / "t10k-labels-idx1-ubyte"
    write_idx(path, labels)
    with pytest.raises(DataError, match=f"label {bad} at index 2 is out of range 0-9") as info:
        load("mnist", "test", isolated / "d")
    assert str(path) in str(info.value)


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
    loader = Loader(images, labels, 10, Device("cpu"), drop_last=False, classes=103)
    batches = list(loader)
    assert len(loader) == len(batches) == 11 and len(batches[-1][1]) == 3
    y = np.concatenate([b[1] for b in batches])
    assert sorted(y) == list(range(103)) and y.dtype == np.int32
    x = np.concatenate([b[0] for b in batches])
    assert x.shape == (103, 1, 28, 28) and x.dtype == np.float32
    np.testing.assert_allclose(x[:, 0, 5, 5], (y / 255 - 0.1307) / 0.3081, rtol=1e-6)


def test_loader_drop_last_shapes_and_order_without_shuffle():
    images, labels = _toy()
    loader = Loader(images, labels, 10, Device("cpu", dtype="float64"), shuffle=False, normalize=False, classes=103)
    batches = list(loader)
    assert len(loader) == len(batches) == 10 and all(len(y) == 10 for _, y in batches)
    assert np.array_equal(np.concatenate([y for _, y in batches]), np.arange(100))
    assert batches[0][0].dtype == np.float64 and batches[0][0].max() <= 1
    with pytest.raises(ValueError):
        Loader(images, labels[:-1], 10, Device("cpu"), classes=103)


def test_loader_reshuffles_per_epoch_reproducibly_and_batch_matches_iteration():
    images, labels = _toy()
    a, b = (Loader(images, labels, 16, Device("cpu"), seed=7, classes=103) for _ in range(2))
    epochs = [[y.tolist() for _, y in a] for _ in range(3)]
    assert a.epoch == 3 and epochs[0] != epochs[1] != epochs[2]
    assert [[y.tolist() for _, y in b] for _ in range(3)] == epochs  # same seed, same batches
    other = Loader(images, labels, 16, Device("cpu"), seed=8, classes=103)
    assert [y.tolist() for _, y in other] != epochs[0]
    for e in range(3):  # any batch of any epoch can be rebuilt, in any order: resume mid-epoch
        for k in reversed(range(len(a))):
            x, y = a.batch(e, k)
            assert y.tolist() == epochs[e][k] and np.array_equal(x[:, 0, 0, 0], b.batch(e, k)[0][:, 0, 0, 0])
    b.epoch = 2
    assert [y.tolist() for _, y in b] == epochs[2]
    with pytest.raises(IndexError):
        a.batch(0, len(a))


def test_loader_draws_and_sends_the_next_epochs_order_once_at_the_middle_batch():
    """Not at the epoch's first batch, where a device just waited for would sit idle for the draw;
    the batches stay those of each epoch's own order."""
    images, labels = _toy()
    loader = Loader(images, labels, 16, Device("cpu"), seed=7, classes=103)
    drawn, order, at = [], loader.order, [None]
    loader.order = lambda epoch: drawn.append((epoch, at[0])) or order(epoch)
    mid = len(loader) // 2
    for e in range(3):
        for k in range(len(loader)):
            at[0] = (e, k)
            np.testing.assert_array_equal(loader.indices(e, k), order(e)[k * 16:(k + 1) * 16])
    assert drawn == [(0, (0, 0)), (1, (0, mid)), (2, (1, mid)), (3, (2, mid))]


@pytest.mark.parametrize("labels, words", [
    (np.array([0, -1, 2, 3]), "label -1 at index 1 is out of range 0-9"),   # was class 9
    (np.array([0, 1, 15, 3]), "label 15 at index 2 is out of range 0-9"),   # was an IndexError
    (np.array([0.0, 1.0, 2.0, 3.0]), "float64, expected (N,) integers"),
    (np.zeros((4, 1), np.int64), "(4, 1) int64, expected (N,) integers"),
])
def test_loader_rejects_bad_labels_naming_the_argument(labels, words):
    with pytest.raises(DataError) as info:
        Loader(np.zeros((4, 28, 28), np.uint8), labels, 2, Device("cpu"))
    assert str(info.value).startswith("Loader labels: ") and words in str(info.value)


@pytest.mark.parametrize("images, words", [
    (np.zeros((4, 784), np.uint8), "images of shape (4, 784) uint8, expected (N, H, W) or (N, C, H, W)"),
    (np.full((4, 28, 28), "x"), "<U1, expected"),
    (np.zeros((5, 28, 28), np.uint8), "5 images but 4 labels"),
])
def test_loader_rejects_bad_images_naming_the_argument(images, words):
    with pytest.raises(DataError) as info:
        Loader(images, np.arange(4), 2, Device("cpu"))
    assert str(info.value).startswith("Loader images: ") and words in str(info.value)


def test_runs_downloading_one_dataset_at_once_fetch_each_file_once(isolated, tmp_path, monkeypatch):
    """Ranks of one host start together on a missing dataset: one downloads each file (through the one
    writer), the others wait for it and find it (issue 40: files.exclusive), and none fails."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("MINIDL_LOCK_DIR", str(tmp_path / "locks"))
    root = tmp_path / "srv"
    hashes = _make_dataset(root)
    asked = []

    class Counting(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url, barrier, found, failed = f"http://127.0.0.1:{httpd.server_address[1]}/", threading.Barrier(3), [], []

    def rank():
        barrier.wait()
        try:
            found.append(find_dataset("mnist", mirrors=[url], hashes=hashes, progress=False))
        except Exception as e:          # noqa: BLE001  the test says which
            failed.append(e)
    try:
        ranks = [threading.Thread(target=rank) for _ in range(3)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not failed and len(found) == 3 and found[0] == found[1] == found[2], failed
    assert sorted(asked) == sorted(f"/{stem}.gz" for stem in STEMS)          # each file fetched once
    assert sorted(os.listdir(isolated / "dataset" / "mnist")) == sorted(STEMS)    # no temporaries, no locks
