import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))        # `from tests.helpers import ...` (importlib mode adds no path)
SHARED = ROOT.parent / "shared" / "datasets"
if "MINIDL_DATA" in os.environ:
    # absolute, so subprocesses started in other folders find it too
    os.environ["MINIDL_DATA"] = os.path.abspath(os.environ["MINIDL_DATA"])
elif SHARED.is_dir():
    os.environ["MINIDL_DATA"] = str(SHARED)


def mnist_lookalike(n, seed=0):
    """(images uint8 (n, 28, 28), labels uint8 (n,)) where a bright 8x8 square's place is the class.

    Noise underneath keeps the images MNIST-like in range; the square makes them learnable in a
    few steps, so tests that train on MNIST also run where the real files are absent. 5% of the
    labels are then redrawn at random: like real data, no net reaches exactly 100%.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 5)
        images[i, 4 + 12 * r:12 + 12 * r, 1 + 5 * q:6 + 5 * q] = 255
    noisy = rng.random(n) < 0.05
    labels[noisy] = rng.integers(0, 10, noisy.sum())
    return images, labels


@pytest.fixture(scope="session")
def mnist_train():
    """MNIST's training split when a lookup root holds it (never downloaded), else 2,000 look-alikes."""
    from minidl import data
    try:
        return data.mnist("train", download=False)
    except data.DataError:  # offline without the files: train on data that needs no network
        return mnist_lookalike(2000)


@pytest.fixture
def no_data(monkeypatch, tmp_path):
    """Run in an empty folder (holding one empty file, `a-file`) where reading data, finding data or
    building a device fails the test: the command lines' flags are checked before any of those."""
    import minidl

    def touched(*a, **k):
        raise AssertionError("data was read or a model was built before the flags were checked")
    for mod, name in ((minidl.data, "load"), (minidl.data, "find_dataset"), (minidl, "get_device")):
        monkeypatch.setattr(mod, name, touched)
    monkeypatch.setenv("MINIDL_DATA", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    return tmp_path
