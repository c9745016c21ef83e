"""fp16 dynamic loss scaling: on the device, a skipped step changes nothing, no stop on overflow,
back-off and growth, and exact resume."""
import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl import optim
from minidl.backend import get_device
from minidl.layers.base import ALL, Layer, record_config
from minidl.training.loss_scale import DynamicLossScale
from minidl.precision import LossScale, policy


def test_the_scale_backs_off_on_overflow_and_grows_after_clean_steps():
    dev = get_device("cpu")
    s = DynamicLossScale(dev, LossScale(init=8.0, interval=3))
    live = np.ones((), bool)
    g = np.full(4, 16.0, np.float32)
    assert s.unscale(g, live) and (g == 2.0).all() and float(s.scale) == 8 and int(s.clean) == 1
    g[2] = np.inf
    assert not s.unscale(g, live)                                    # skipped, backed off, count restarts
    assert (float(s.scale), int(s.clean), int(s.skipped)) == (4.0, 0, 1)
    for k in range(3):
        assert s.unscale(np.ones(4, np.float32), live)
    assert (float(s.scale), int(s.clean)) == (8.0, 0)                # x2 after 3 clean steps
    g = np.full(4, np.nan, np.float32)
    assert not s.unscale(g, np.zeros((), bool))                      # a diverged run: the scale is left alone
    assert (float(s.scale), int(s.clean), int(s.skipped)) == (8.0, 0, 1)


class Spike(Layer):
    """y = x;  gx = gy * factor (a device array the test sets to inf to inject an overflow)."""
    prefix = "spike"

    @record_config
    def __init__(self, name=None):
        super().__init__(name)

    def build(self, in_shapes, device):
        self.factor = device.xp.ones((), np.float32)
        return in_shapes[0]

    def forward(self, xs, training):
        return xs[0]

    def backward(self, gy, need=ALL):
        with np.errstate(invalid="ignore"):
            return ((gy * self.factor).astype(gy.dtype),)


def _spiky_net():
    x = L.Input((1, 28, 28))
    h = L.MaxPool2D(2)(L.Conv2D(4, 5, activation="relu")(L.Normalize()(x)))     # MNIST's, by the Loader
    y = L.Dense(10)(Spike()(L.Dense(16, activation="relu")(L.Flatten()(h))))
    return dl.Model(x, y, seed=1)


def _data(n=256, seed=0):
    from conftest import mnist_lookalike
    return mnist_lookalike(n, seed)


def test_an_overflowing_step_is_skipped_without_a_stop_and_training_goes_on():
    model = _spiky_net()
    trainer = dl.Trainer(model, optim.Adam(lr=1e-3), device="cpu", progress=False, log=lambda s: None,
                         precision=policy("fp16", loss_scale=LossScale(init=2.0 ** 10, interval=3)))
    spike = trainer._step.net.layer("spike").factor        # the lowered net's copy of the layer runs
    data = _data()
    trainer.fit(data, steps=2, batch_size=32)
    before = (model.flat.copy(), {k: v.copy() for k, v in trainer.optimizer.state.items()}, trainer.optimizer.t)
    spike.fill(np.inf)
    trainer.fit(data, more_steps=1, batch_size=32)                        # no TrainingDiverged
    assert trainer.step == 3 and trainer.loss_scale == {"scale": 512.0, "clean": 0, "skipped": 1}
    assert np.array_equal(model.flat, before[0]) and trainer.optimizer.t == before[2] == 2
    assert all(np.array_equal(trainer.optimizer.state[k], v) for k, v in before[1].items())
    spike.fill(1.0)
    trainer.fit(data, more_steps=3, batch_size=32)
    assert trainer.loss_scale == {"scale": 1024.0, "clean": 0, "skipped": 1}    # x2 after 3 clean steps
    assert not np.array_equal(model.flat, before[0]) and trainer.optimizer.t == 5


def test_a_scale_too_large_for_fp16_backs_off_until_the_gradients_fit():
    model = _spiky_net()
    trainer = dl.Trainer(model, optim.SGD(lr=0.1), device="cpu", progress=False, log=lambda s: None,
                         precision=policy("fp16", loss_scale=LossScale(init=2.0 ** 40)))
    w0 = model.flat.copy()
    trainer.fit(_data(), steps=1, batch_size=32)
    # (softmax - onehot)/32 * 2^40 is far beyond float16's 65504: every gradient overflows
    assert trainer.loss_scale["skipped"] == 1 and np.array_equal(model.flat, w0)
    trainer.fit(_data(), more_steps=40, batch_size=32)
    s = trainer.loss_scale
    assert s["skipped"] == 40 - np.log2(s["scale"]) < 41                # one halving per skipped step, then it fits
    assert s["clean"] == 41 - s["skipped"] and not np.array_equal(model.flat, w0)


def test_a_nan_loss_still_stops_fp16_training(tmp_path):
    images, labels = _data()
    images = images.astype(np.float32) / 255                            # the Loader's float contract
    images[:, 14, 14] = np.nan                                           # every batch carries a NaN
    trainer = dl.Trainer(_spiky_net(), optim.Adam(lr=1e-3), device="cpu", progress=False, log=lambda s: None,
                         precision="fp16")
    with pytest.raises(dl.TrainingDiverged, match="nan"):
        trainer.fit((images, labels), steps=5, batch_size=32, monitor=5)


def test_a_resumed_fp16_run_ends_as_the_run_never_stopped(tmp_path):
    data = _data(512)
    cfg = policy("fp16", loss_scale=LossScale(init=2.0 ** 20, interval=4))

    def trainer():
        return dl.Trainer(_spiky_net(), optim.Adam(lr=1e-3), device="cpu", progress=False, log=lambda s: None,
                          precision=cfg)
    straight = trainer()
    straight.fit(data, steps=12, batch_size=32)
    first = trainer()
    first.fit(data, steps=5, batch_size=32, save_to=tmp_path / "half.npz")
    resumed = trainer()
    resumed.resume(tmp_path / "half.npz")
    resumed.fit(data, steps=12, batch_size=32)                           # the run's total, as -n
    assert straight.loss_scale["skipped"] > 0                            # 2^20 overflows at first
    assert resumed.loss_scale == straight.loss_scale
    assert np.array_equal(resumed.model.flat, straight.model.flat)
