"""fit's host-fed sources on the GPU (issue 39 point 5): a generator or a map-style dataset feeds
the captured step through its fixed device buffers and trains what the arrays train; a stream gives
the captured step no extra batch; new arrays at every fit keep one loader and one captured step."""
import gc

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import layers as L, optim  # noqa: E402
from minidl.data import Loader  # noqa: E402
from minidl.data.host_loader import BatchLoader, DatasetLoader  # noqa: E402

rng = np.random.default_rng(0)
X = rng.integers(0, 256, (256, 1, 12, 12)).astype(np.uint8)
Y = rng.integers(0, 10, 256)


def trainer(seed=0):
    model = dl.Sequential([L.Conv2D(8, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.MaxPool2D(2), L.Flatten(),
                           L.Dense(10), L.Softmax()], input_shape=(1, 12, 12), device=dl.get_device("cuda", seed=seed),
                          seed=seed)
    t = dl.Trainer(model, optim.Adam(1e-3), seed=seed, progress=False, log=lambda *a: None)
    assert t.graph, "the device captures training steps"
    return t


def batches(epochs=1, batch_size=32, count=None):
    """The array path's batches in its order (Loader.order), as host arrays; count[0] counts reads."""
    order = Loader(X, Y, batch_size, dl.get_device("cpu")).order
    for e in range(epochs):
        idx = order(e)
        for k in range(len(X) // batch_size):
            if count is not None:
                count[0] += 1
            sel = idx[k * batch_size:(k + 1) * batch_size]
            yield X[sel], Y[sel]


class Dataset:
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], int(Y[i])


def fitted(data, **fit):
    t = trainer()
    score = t.fit(data, **fit)
    return t, t.model.get_weights(), score


@pytest.mark.parametrize("source", ["generator", "dataset"])
def test_a_host_fed_captured_step_trains_what_the_array_fed_one_trains(source):
    _, want, want_score = fitted((X, Y), epochs=2, batch_size=32, monitor=16)
    data = batches(epochs=2) if source == "generator" else Dataset()
    fit = dict(steps_per_epoch=8, epochs=2) if source == "generator" else dict(epochs=2, batch_size=32)
    t, got, score = fitted(data, monitor=16, **fit)
    kind = BatchLoader if source == "generator" else DatasetLoader
    assert [type(t._trained_on)] == [kind] and len(t._step._captured) == 1      # it ran captured
    assert t.step == 16
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert score.loss == pytest.approx(want_score.loss, rel=1e-5)


def test_a_stream_gives_the_captured_step_no_extra_batch():
    t = trainer()
    t.fit((X, Y), steps=3, batch_size=32)           # a later fit starts at step 3: its capture asks for that step
    count = [0]
    t.fit(batches(epochs=4, count=count), more_steps=5)
    assert t.step == 8 and count[0] == 5 + 1       # the five trained, and one read ahead (the end is known early)


def test_new_arrays_at_every_fit_keep_one_loader_and_one_captured_step():
    t = trainer()
    def big(s):                                      # 11.5 MB once float32
        return np.random.default_rng(s).integers(0, 256, (20000, 1, 12, 12)).astype(np.uint8)
    for s in range(2):                               # the first fits make what every later one reuses
        t.fit(big(s), np.zeros(20000, int), more_steps=2)
    gc.collect()
    used = t.device.memory_bytes().used
    for s in range(2, 14):
        t.fit(big(s), np.zeros(20000, int), more_steps=2)
    gc.collect()
    assert len(t._step._captured) == 1
    assert t.device.memory_bytes().used - used < 2 * 20000 * 144 * 4      # not 12 loaders (138 MB)
