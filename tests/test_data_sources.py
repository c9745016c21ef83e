"""What fit and evaluate take besides arrays (issue 39 point 5, issue 38 points 5-7): map-style
datasets, iterables and generators of batches, NHWC images, a user augmentation hook; the array
loader kept across fits without keeping old arrays alive, and arrays changed in place seen."""
import gc
import tracemalloc
import warnings

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, optim
from minidl.data import DataError, Loader
from minidl.data.host_loader import DatasetLoader
from minidl.training.callbacks import Callback

rng = np.random.default_rng(0)
X = rng.integers(0, 256, (96, 1, 8, 8)).astype(np.uint8)
Y = rng.integers(0, 10, 96)


def net(C=1, seed=0):
    return dl.Sequential([L.Conv2D(4, 3, padding=1), L.ReLU(), L.Flatten(), L.Dense(10), L.Softmax()],
                         input_shape=(C, 8, 8), seed=seed)


def trainer(model=None, **kw):
    return dl.Trainer(model or net(), optim.SGD(lr=0.05), device="cpu", progress=False, log=lambda *a: None, **kw)


def loader_batches(images, labels, batch_size, epochs=1, seed=0):
    """The batches the array path trains on, in its order (Loader.order), as host arrays."""
    for e in range(epochs):
        order = Loader(images, labels, batch_size, dl.get_device("cpu"), seed=seed).order(e)
        for k in range(len(images) // batch_size):
            idx = order[k * batch_size:(k + 1) * batch_size]
            yield images[idx], labels[idx]


class Dataset:
    """A map-style dataset as PyTorch users have it: one (image, label) per index, the label a scalar."""

    def __init__(self, images, labels):
        self.images, self.labels, self.reads = images, labels, 0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        self.reads += 1
        return self.images[i], np.int64(self.labels[i])


class Epochs(Callback):
    def __init__(self):
        self.ends = []

    def on_epoch_end(self, run, epoch):
        self.ends.append((run.step, epoch))


def weights_after(data, **fit):
    t = trainer()
    t.fit(data, **fit)
    return t.model.get_weights(), t


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---- sources ----

def test_a_map_style_dataset_trains_the_weights_the_arrays_train():
    want, _ = weights_after((X, Y), epochs=2, batch_size=16)
    ds = Dataset(X, Y)
    got, t = weights_after(ds, epochs=2, batch_size=16)
    same(got, want)
    assert t.step == 2 * (96 // 16) and ds.reads == 2 * 96 + 1    # + the item that tells it apart


def test_a_generator_of_batches_trains_the_weights_the_arrays_train():
    want, _ = weights_after((X, Y), epochs=2, batch_size=16)
    calls = Epochs()
    got, t = weights_after(loader_batches(X, Y, 16, epochs=2), steps_per_epoch=6, epochs=2, callbacks=[calls])
    same(got, want)
    assert t.step == 12 and calls.ends == [(6, 0), (12, 1)]


def test_an_exhausted_generator_ends_the_epoch_and_the_run():
    calls = Epochs()
    t = trainer()
    score = t.fit(loader_batches(X, Y, 16), callbacks=[calls], monitor=4)
    assert t.step == 6 and calls.ends == [(6, 0)] and np.isfinite(score.loss)


def test_a_generator_that_runs_out_before_steps_ends_the_run_with_a_warning():
    t = trainer()
    with pytest.warns(UserWarning, match="ran out after 6 batches"):
        t.fit(loader_batches(X, Y, 16), steps=10)
    assert t.step == 6


def test_an_infinite_generator_runs_steps_per_epoch_times_epochs():
    def forever():
        while True:
            yield X[:16], Y[:16]
    calls = Epochs()
    t = trainer()
    t.fit(forever(), epochs=3, steps_per_epoch=4, callbacks=[calls])
    assert t.step == 12 and [e for _, e in calls.ends] == [0, 1, 2]


def test_a_list_of_batches_is_read_again_each_epoch_and_its_smaller_last_batch_left_out():
    batches = [(X[a:b], Y[a:b]) for a, b in ((0, 32), (32, 64), (64, 80))]     # 32, 32, 16
    calls = Epochs()
    t = trainer()
    t.fit(batches, epochs=3, callbacks=[calls])
    assert t.step == 6 and calls.ends == [(2, 0), (4, 1), (6, 2)]


def test_evaluate_takes_each_source_alike():
    t = trainer()
    t.fit((X, Y), steps=3, batch_size=16)
    want = t.evaluate(X, Y, batch_size=40)
    for data in (Dataset(X, Y), [(X[i:i + 40], Y[i:i + 40]) for i in range(0, 96, 40)],
                 (b for b in [(X[:50], Y[:50]), (X[50:], Y[50:])])):
        got = t.evaluate(data, batch_size=40)
        assert got.loss == pytest.approx(want.loss, rel=1e-6) and got.accuracy == want.accuracy


def test_host_batches_pass_the_input_contract():
    t = trainer()
    with pytest.raises(DataError, match=r"fit batch 0 images: float32 values in \[0, 255\]"):
        t.fit([(X[:16].astype(np.float32), Y[:16])], steps=1)
    with pytest.raises(DataError, match="fit batch 0 labels: label 12"):
        t.fit([(X[:16], np.full(16, 12))], steps=1)
    floats = [(X[i:i + 16] / np.float32(255), Y[i:i + 16]) for i in range(0, 96, 16)]
    same(weights_after(floats, epochs=1)[0], weights_after([(X[i:i + 16], Y[i:i + 16]) for i in range(0, 96, 16)],
                                                           epochs=1)[0])


def test_a_smaller_batch_before_the_last_is_refused():
    batches = [(X[:16], Y[:16]), (X[16:24], Y[16:24]), (X[24:40], Y[24:40])]
    with pytest.raises(DataError, match="a batch of 8 images among batches of 16"):
        trainer().fit(batches, epochs=1)


def test_what_is_not_data_is_one_line_naming_the_accepted_forms():
    t = trainer()
    for bad, kind in (({"x": X, "y": Y}, "dict"), (5, "int"), (X, "an array alone")):
        with pytest.raises(TypeError, match=f"fit: {kind}.* is not data here; pass .*map-style dataset"):
            t.fit(bad, steps=1)
    class ByName:                                      # a DataFrame's shape: columns by name
        def __len__(self):
            return 2

        def __getitem__(self, name):
            return {"x": X, "y": Y}[name]
    with pytest.raises(TypeError, match=r"fit: ByName\[0\] is no item; pass a Loader or a pair"):
        t.fit(ByName(), steps=1)
    with pytest.raises(DataError, match="fit: the list holds no data"):
        t.fit([], steps=1)
    with pytest.raises(ValueError, match="apply to the data fit makes a loader from, not to a Loader"):
        t.fit(Loader(X, Y, 16, t.device), steps=1, data_format="channels_last")
    with pytest.raises(ValueError, match="epochs=2 needs steps_per_epoch"):
        t.fit(loader_batches(X, Y, 16), epochs=2)
    with pytest.raises(ValueError, match="steps_per_epoch is for a source without len"):
        t.fit(X, Y, steps_per_epoch=2)
    with pytest.raises(ValueError, match="labels given twice"):
        t.fit(Dataset(X, Y), Y)
    with pytest.raises(TypeError, match=r"must yield \(x_batch, y_batch\) pairs, got ndarray"):
        t.fit(iter([X[:16]]))


def test_a_two_output_model_is_refused_naming_its_outputs():
    x = L.Input((1, 8, 8))
    h = L.Flatten()(x)
    model = dl.Model(x, [L.Dense(10, name="digits")(h), L.Dense(10, name="parity")(h)])
    t = trainer(model)
    for call in (lambda: t.fit(X, Y, steps=1), lambda: t.evaluate(X, Y)):
        with pytest.raises(ValueError, match=r"has 2 outputs \(digits, parity\)"):
            call()


# ---- NHWC ----

@pytest.mark.parametrize("C", [1, 3])
def test_nhwc_images_are_found_or_flagged_and_train_as_nchw(C):
    images = rng.integers(0, 256, (48, C, 8, 8)).astype(np.uint8)
    labels = Y[:48]
    nhwc = images.transpose(0, 2, 3, 1).copy()
    runs = []
    for data, fmt in (((images, labels), None), ((nhwc, labels), None), ((nhwc, labels), "channels_last"),
                      ([(nhwc[:16], labels[:16]), (nhwc[16:32], labels[16:32])], None)):
        t = trainer(net(C))
        t.fit(data, steps=2, batch_size=16, data_format=fmt)
        runs.append((t.model.get_weights(), t.evaluate(nhwc if fmt else images, labels, data_format=fmt)))
    for w, score in runs[1:3]:
        same(w, runs[0][0])
        assert score == runs[0][1]
    assert not np.array_equal(runs[3][0]["conv2d/w"], net(C).get_weights()["conv2d/w"])


def test_an_image_shape_of_neither_layout_is_one_error_naming_both():
    t = trainer(net(3))
    bad = rng.integers(0, 256, (16, 8, 3, 8)).astype(np.uint8)
    with pytest.raises(DataError, match=r"\(16, 8, 3, 8\), but model takes \(N, 3, 8, 8\) \(channels first\) "
                                        r"or \(N, 8, 8, 3\) with data_format='channels_last'"):
        t.fit(bad, Y[:16], steps=1)
    with pytest.raises(DataError, match="data_format='channels_last'"):
        t.fit(rng.integers(0, 256, (16, 3, 8, 8)).astype(np.uint8), Y[:16], steps=1, data_format="channels_last")
    with pytest.raises(ValueError, match="data_format must be 'channels_first' or 'channels_last', got 'NHWC'"):
        t.fit(bad, Y[:16], steps=1, data_format="NHWC")


# ---- augment ----

def test_augment_sees_host_batches_and_trains_what_it_returns():
    seen = []

    def invert(x, y):
        seen.append((type(x), x.shape, x.dtype))
        return 255 - x, y
    got, t = weights_after((X, Y), epochs=1, batch_size=16, augment=invert)
    want, _ = weights_after((255 - X, Y), epochs=1, batch_size=16)
    same(got, want)
    assert seen == [(np.ndarray, (16, 1, 8, 8), np.uint8)] * 6
    nhwc = []
    trainer(net(3)).fit(rng.integers(0, 256, (32, 8, 8, 3)).astype(np.uint8), Y[:32], steps=1, batch_size=16,
                        augment=lambda x, y: (nhwc.append(x.shape), (x, y))[1])
    assert nhwc == [(16, 8, 8, 3)]                     # as the data holds them, before the move to NCHW
    with pytest.raises(DataError, match="augment must return a pair"):
        trainer().fit(X, Y, steps=1, augment=lambda x, y: x)
    with pytest.raises(DataError, match="fit batch 0 images: float64 values"):
        trainer().fit(X, Y, steps=1, augment=lambda x, y: (x * 1.0, y))


# ---- the array loader across fits (issue 38 points 5 and 6) ----

def test_arrays_changed_in_place_between_fits_are_seen():
    t = trainer()
    images = X.copy()
    t.fit(images, Y, steps=1, batch_size=16)
    first = t._loaders.loader
    t.fit(images, Y, steps=1, batch_size=16)
    assert t._loaders.loader is first                 # unchanged arrays: the same loader (its captured step)
    images[:] = 255 - images
    t.fit(images, Y, steps=1, batch_size=16)
    again = t._loaders.loader
    assert again is not first
    np.testing.assert_allclose(again.x, (255 - X) / np.float32(255), atol=1e-6)   # no Normalize: [0, 1] as it is


def test_twelve_fits_on_new_arrays_keep_memory_bounded():
    t = trainer()
    def big(s):                                        # 0.5 MB once float32
        return np.random.default_rng(s).integers(0, 256, (2000, 1, 8, 8)).astype(np.uint8)
    t.fit(big(0), np.zeros(2000, int), steps=1)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for s in range(1, 13):
            t.fit(big(s), np.zeros(2000, int), steps=1)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 2 * 2000 * 64 * 4, f"{grown} bytes kept after 12 fits"       # less than two loaders' copies


class TorchLike:
    """What a PyTorch DataLoader gives without torch: a len() and a new pass per iter(), lists [x, y]
    of float images in [0, 1], a smaller last batch."""

    def __init__(self, batch_size=32):
        self.batch_size = batch_size

    def __len__(self):
        return -(-len(X) // self.batch_size)

    def __iter__(self):
        order = np.random.default_rng().permutation(len(X))
        for i in range(0, len(X), self.batch_size):
            idx = order[i:i + self.batch_size]
            yield [X[idx].astype(np.float32) / 255, Y[idx]]


def test_a_dataloader_with_a_smaller_last_batch_trains_len_steps_an_epoch():
    calls = Epochs()
    t = trainer()
    t.fit(TorchLike(40), epochs=2, callbacks=[calls])         # 40, 40, 16: the 16 left out
    assert t.step == 6 and calls.ends == [(3, 0), (6, 1)]


def test_a_user_loader_and_a_generator_are_not_kept():
    t = trainer()
    t.fit(Loader(X, Y, 16, t.device, normalize=False), steps=1)      # what the net declares: nothing
    t.fit(loader_batches(X, Y, 16), steps=1)
    assert t._loaders.loader is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.fit(X, Y, steps=1)
    assert isinstance(t._loaders.loader, Loader)


def test_a_dataset_is_shared_among_ranks_as_arrays_are():
    dev = dl.get_device("cpu")
    for rank in range(3):
        want = Loader(X[:40], Y[:40], 8, dev, shuffle=False, drop_last=False, rank=rank, world=3)
        got = DatasetLoader(Dataset(X[:40], Y[:40]), 8, dev, shuffle=False, drop_last=False, rank=rank, world=3,
                            training=False)
        assert len(got) == len(want) == 2
        for (gx, gy), (wx, wy) in zip(got, want):      # rank 2's second batch is empty in both
            assert gy.tolist() == wy.tolist() and gx.size == wx.size
            np.testing.assert_array_equal(gx.reshape(wx.shape), wx)
