"""Checkpoints: round trip, exact resume, atomic saves, clear errors, no pickle."""
import json
import os
import zipfile

import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint as ckpt
from minidl import layers as L, models, optim
from minidl.checkpoint import CheckpointError
from minidl.files import WriteError


@pytest.fixture(scope="module")
def mnist_small(mnist_train):  # conftest: real MNIST, or look-alikes where it is absent
    images, labels = mnist_train
    return images[:300], labels[:300]


def bn_dropout_net(seed=0, width=4, name_suffix=""):
    """conv -> BN -> ReLU -> pool -> flatten -> dropout -> dense -> softmax on 28x28."""
    return dl.Sequential([
        L.Conv2D(width, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.MaxPool2D(4),
        L.Flatten(), L.Dropout(0.3), L.Dense(10), L.Softmax(),
    ], (1, 28, 28), seed=seed)


def make_trainer(seed=0, model_seed=0, lr=2e-3):
    model = bn_dropout_net(seed=model_seed)
    return dl.Trainer(model, optim.Adam(lr=lr), device="cpu", seed=seed, progress=False, log=lambda s: None)


def assert_same_state(a, b):
    """Bit-identical weights, running statistics, optimizer state, step and dropout generator."""
    wa, wb = a.model.get_weights(), b.model.get_weights()
    assert wa.keys() == wb.keys()
    for k in wa:
        assert np.array_equal(wa[k], wb[k]), f"{k} differs"
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["t"] == sb["t"] and sa["config"] == sb["config"]
    for k in sa["arrays"]:
        assert np.array_equal(sa["arrays"][k], sb["arrays"][k]), f"optimizer {k} differs"
    assert a.step == b.step
    assert a.device.rng.state() == b.device.rng.state()


# -- round trip ---------------------------------------------------------------------------------

def test_round_trip_weights_bn_statistics_and_adam_state(mnist_small, tmp_path):
    src = make_trainer()
    src.fit(mnist_small, steps=7, batch_size=32, monitor=100)
    w = src.model.get_weights()
    assert not np.allclose(w["fbn/running_mean"], 0)        # the statistics moved
    assert not np.allclose(w["fbn/running_var"], 1)
    path = str(tmp_path / "c.npz")
    assert src.save(path) == path

    dst = make_trainer(model_seed=1)                          # other weights, fresh Adam (t = 0)
    assert not np.array_equal(dst.model.get_weights()["conv2d/w"], w["conv2d/w"])
    meta = dst.resume(path)
    assert meta["step"] == 7
    assert dst.optimizer.t == 7
    assert_same_state(src, dst)
    x = np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32)
    assert np.array_equal(src.model.forward(x), dst.model.forward(x))   # eval uses the statistics


def test_optimizer_hyperparameters_are_restored(tmp_path):
    model = bn_dropout_net()
    opt = optim.Adam(lr=3e-4, b1=0.8, b2=0.95, eps=1e-6)
    opt.setup(model)
    opt.t = 11
    path = str(tmp_path / "c.npz")
    ckpt.save(path, model, opt, {"step": 11})
    fresh = optim.Adam()
    fresh.setup(bn_dropout_net())
    ckpt.load(path, fresh.model, fresh)
    assert (fresh.lr, fresh.b1, fresh.b2, fresh.eps, fresh.t) == (3e-4, 0.8, 0.95, 1e-6, 11)


# -- exact resume -------------------------------------------------------------------------------

def test_resume_mid_epoch_is_bit_identical_to_a_straight_run(mnist_small, tmp_path):
    N, M, B = 13, 10, 32
    per_epoch = len(mnist_small[0]) // B                     # 9: N lands mid-epoch, N+M crosses
    assert N % per_epoch and N // per_epoch != (N + M) // per_epoch

    straight = make_trainer(seed=5)
    straight.fit(mnist_small, steps=N + M, batch_size=B, monitor=4)

    first = make_trainer(seed=5)
    path = str(tmp_path / "ckpt.npz")
    first.fit(mnist_small, steps=N, batch_size=B, monitor=4, save_to=path)
    del first

    resumed = make_trainer(seed=123, model_seed=7)           # nothing shared but the checkpoint
    resumed.resume(path)
    assert resumed.step == N and resumed.seed == 5
    resumed.fit(mnist_small, steps=N + M, batch_size=B, monitor=4)      # the run's total, as -n
    assert_same_state(straight, resumed)

    # the test can fail: continuing with the dropout generator one draw off gives another run
    off = make_trainer(seed=5)
    off.resume(path)
    off.device.rng.offset += 1
    off.fit(mnist_small, more_steps=M, batch_size=B, monitor=4)
    assert not np.array_equal(off.model.get_weights()["dense/w"], straight.model.get_weights()["dense/w"])


# -- atomic save --------------------------------------------------------------------------------

def _savez_dies_midway(f, **arrays):
    f.write(b"PK\x03\x04 half a zip file")
    raise OSError("disk full")


def _savez_interrupted(f, **arrays):
    f.write(b"PK\x03\x04")
    raise KeyboardInterrupt


def _replace_dies(src, dst):
    raise OSError("rename failed")


@pytest.mark.parametrize("target,fake,exc", [(np, _savez_dies_midway, WriteError),
                                             (np, _savez_interrupted, KeyboardInterrupt),
                                             (os, _replace_dies, WriteError)])
def test_interrupted_save_keeps_the_previous_checkpoint(target, fake, exc, tmp_path, monkeypatch):
    trainer = make_trainer()
    path = tmp_path / "c.npz"
    trainer.save(str(path))
    good = path.read_bytes()
    trainer.model.set_weights({k: v + 1 for k, v in trainer.model.get_weights().items()})
    monkeypatch.setattr(target, "savez" if target is np else "replace", fake)
    with pytest.raises(exc):
        trainer.save(str(path))
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["c.npz"]                  # no temporary file (nor lock) left behind
    fresh = make_trainer(model_seed=3)
    fresh.resume(str(path))                                   # and it still loads


def test_saved_file_has_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "c.npz"
    make_trainer().save(str(path))
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask)


def test_numpy_scalar_hyperparameters_save_and_reload(tmp_path):
    model = dl.Sequential([L.Flatten(), L.Dense(np.prod((2, 5))), L.Dropout(np.float32(0.5))], (1, 4, 4))
    path = str(tmp_path / "c.npz")
    ckpt.save(path, model)
    rebuilt = ckpt.load_model(path)
    assert rebuilt.config() == json.loads(json.dumps(rebuilt.config()))
    x = np.ones((2, 1, 4, 4), np.float32)
    assert np.array_equal(rebuilt.forward(x), model.forward(x))


def test_save_creates_missing_folders(tmp_path):
    path = tmp_path / "a" / "b" / "c.npz"
    make_trainer().save(str(path))
    assert path.is_file()


# -- errors -------------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "model.npz")
    ckpt.save(path, bn_dropout_net(), None, {"step": 0})
    return path


def test_load_into_a_model_with_other_layer_names(saved):
    other = dl.Sequential([
        L.Conv2D(4, 3, padding=1, name="features"), L.BatchNorm2D(), L.ReLU(), L.MaxPool2D(4),
        L.Flatten(), L.Dropout(0.3), L.Dense(10), L.Softmax(),
    ], (1, 28, 28))
    with pytest.raises(CheckpointError) as e:
        ckpt.load_weights(saved, other)
    msg = str(e.value)
    assert saved in msg
    assert "features/w" in msg and "conv2d/w" in msg          # missing and unknown, by name


def test_load_into_a_model_with_other_shapes(saved):
    wider = bn_dropout_net(width=6)
    with pytest.raises(CheckpointError) as e:
        ckpt.load_weights(saved, wider)
    msg = str(e.value)
    assert saved in msg
    assert "conv2d/w" in msg and "(6, 1, 3, 3)" in msg and "(4, 1, 3, 3)" in msg


def test_a_checkpoint_that_does_not_fit_leaves_the_model_untouched(tmp_path):
    small = dl.Sequential([L.Conv2D(4, 3), L.Flatten(), L.Dense(10)], (1, 8, 8), seed=0)
    path = str(tmp_path / "small.npz")
    ckpt.save(path, small)
    other = dl.Sequential([L.Conv2D(4, 3), L.Flatten(), L.Dense(5)], (1, 8, 8), seed=1)
    before = other.get_weights()
    with pytest.raises(CheckpointError, match="dense/w"):
        ckpt.load_weights(path, other)
    after = other.get_weights()
    assert [k for k in before if not np.array_equal(before[k], after[k])] == []


def test_resume_with_another_optimizer_is_a_checkpoint_error(tmp_path):
    path = str(tmp_path / "c.npz")
    make_trainer().save(path)
    sgd = dl.Trainer(bn_dropout_net(), optim.SGD(lr=0.1), device="cpu", progress=False)
    with pytest.raises(CheckpointError, match="adam"):
        sgd.resume(path)


def test_missing_file_names_the_file(tmp_path):
    path = str(tmp_path / "nope.npz")
    for call in (lambda: ckpt.load(path, bn_dropout_net()), lambda: ckpt.load_model(path),
                 lambda: make_trainer().resume(path)):
        with pytest.raises(CheckpointError, match="nope.npz"):
            call()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "foreign_npz", "bad_json"])
def test_corrupt_file_names_the_file(damage, saved):
    raw = open(saved, "rb").read()
    if damage == "truncated":
        open(saved, "wb").write(raw[:len(raw) // 2])
    elif damage == "garbage":
        open(saved, "wb").write(b"\x00not a zip\xff" * 100)
    elif damage == "empty":
        open(saved, "wb").close()
    elif damage == "foreign_npz":
        with open(saved, "wb") as f:
            np.savez(f, x=np.zeros(3))
    else:
        with open(saved, "wb") as f:
            np.savez(f, __meta__=np.frombuffer(b"{not json", dtype=np.uint8))
    with pytest.raises(CheckpointError) as e:
        ckpt.load(saved, bn_dropout_net())
    assert saved in str(e.value)


def test_unknown_format_is_rejected(saved):
    with open(saved, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps({"format": "other-9"}).encode(), dtype=np.uint8))
    with pytest.raises(CheckpointError, match="other-9"):
        ckpt.read(saved)


# -- architecture and format --------------------------------------------------------------------

def test_load_model_rebuilds_the_architecture(tmp_path):
    x = dl.Input((1, 12, 12))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(x)))
    s = L.Conv2D(4, 1, bias=False)(x)
    h = L.Add()(s, h)
    h = L.Dropout(0.2)(L.Flatten()(L.MaxPool2D(2, stride=2)(h)))
    y = L.Softmax()(L.Dense(10)(h))
    model = dl.Model(x, y, seed=4, name="net")
    trainer = dl.Trainer(model, optim.Adam(), device="cpu", progress=False)
    rng = np.random.default_rng(0)
    trainer.fit((rng.integers(0, 256, (64, 12, 12), dtype=np.uint8), rng.integers(0, 10, 64)),
                steps=3, batch_size=16, monitor=10)
    path = str(tmp_path / "net.npz")
    trainer.save(path)

    rebuilt = ckpt.load_model(path)
    assert [layer.name for layer in rebuilt.layers] == [layer.name for layer in model.layers]
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in model.layers]
    assert rebuilt.config() == model.config()
    xb = rng.standard_normal((6, 1, 12, 12)).astype(np.float32)
    assert np.array_equal(rebuilt.forward(xb), model.forward(xb))


def test_load_model_lenet5(tmp_path):
    model = models.lenet5(seed=2)
    path = str(tmp_path / "lenet5.npz")
    ckpt.save(path, model)
    rebuilt = ckpt.load_model(path)
    assert rebuilt.n_params == model.n_params == 61706
    xb = np.random.default_rng(1).random((3, 1, 28, 28), dtype=np.float32)          # images in [0, 1]
    assert np.array_equal(rebuilt.forward(xb), model.forward(xb))


def test_files_contain_no_pickle(mnist_small, tmp_path):
    trainer = make_trainer()
    trainer.fit(mnist_small, steps=2, batch_size=32, monitor=10)
    path = str(tmp_path / "c.npz")
    trainer.save(path)
    with zipfile.ZipFile(path) as z:
        assert all(n.endswith(".npy") for n in z.namelist())
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}                  # raises on any object array
    assert all(a.dtype != object for a in arrays.values())
    assert {"param/conv2d/w", "param/fbn/running_var", "optim/m", "optim/v", "__meta__"} <= set(arrays)
    info = json.loads(arrays["__meta__"].tobytes())
    assert info["format"] == ckpt.FORMAT
    assert info["meta"]["step"] == 2 and info["optimizer"]["t"] == 2
    assert info["model"] == trainer.model.config()
