"""Trainer: a small net learns real MNIST, the seed's monitor line, NaN stop, evaluation over the
whole set, epochs, and the logits path for models that end in Softmax (all on the CPU)."""
import math
import re

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, models, optim

# the seed's line: `step:  100, loss: 0.082, accuracy: 45.188%` (step right-aligned in 4 columns)
MONITOR_LINE = re.compile(r"step: (?P<pad> *)(?P<step>\d+), loss: (?P<loss>\d+\.\d{3}), "
                          r"accuracy: (?P<acc>\d+\.\d{3})%")


def as_fed(images, dtype=np.float32):
    """What the Loader feeds a model without Normalize: images / 255, as (N, 1, H, W) (docs/input.md)."""
    x = images.reshape(len(images), 1, *images.shape[1:]).astype(dtype)
    x /= 255
    return x


def log_softmax64(z):
    z = np.asarray(z, dtype=np.float64)
    s = z - z.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


def tiny_net(input_shape=(1, 8, 8), classes=10, seed=0, softmax=True):
    layers = [L.Flatten(), L.Dense(16), L.ReLU(), L.Dense(classes)] + ([L.Softmax()] if softmax else [])
    return dl.Sequential(layers, input_shape, seed=seed)


# -- (1) a small net learns ---------------------------------------------------------------------

def test_lenet5_learns_2000_mnist_images(mnist_train):
    images, labels = mnist_train[0][:2000], mnist_train[1][:2000]
    model = models.lenet5(seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=2e-3), device="cpu", progress=False, log=lambda s: None)
    before_loss, before_acc = trainer.evaluate((images, labels))
    assert before_acc < 0.30                           # an untrained net guesses
    trainer.fit((images, labels), epochs=3, batch_size=32, monitor=1000)
    assert trainer.step == 3 * (2000 // 32)
    loss, acc = trainer.evaluate((images, labels))
    assert acc >= 0.90, f"training accuracy {acc:.2%} after 3 epochs"
    assert loss < before_loss / 4


# -- (2) the monitor line -----------------------------------------------------------------------

def test_monitor_line_format_every_monitor_steps():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (256, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, 256).astype(np.uint8)
    lines = []
    trainer = dl.Trainer(tiny_net(), optim.SGD(lr=0.05), device="cpu", progress=False, log=lines.append)
    result = trainer.fit((images, labels), steps=20, batch_size=16, monitor=5)
    assert len(lines) == 4, lines
    for line, step in zip(lines, (5, 10, 15, 20)):
        m = MONITOR_LINE.fullmatch(line)
        assert m, f"not the seed's monitor line: {line!r}"
        assert int(m["step"]) == step
        assert len(m["pad"]) + len(m["step"]) == 4           # `step:    5`, `step:  100`
        assert 0.0 <= float(m["acc"]) <= 100.0
    last = MONITOR_LINE.fullmatch(lines[-1])
    assert float(last["loss"]) == pytest.approx(result[0], abs=5e-4)
    assert float(last["acc"]) == pytest.approx(result.percent, abs=5e-4)


def test_monitor_line_at_step_100_matches_seed_width():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (64, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, 64).astype(np.uint8)
    lines = []
    trainer = dl.Trainer(tiny_net(), optim.SGD(lr=0.01), device="cpu", progress=False, log=lines.append)
    trainer.fit((images, labels), steps=100, batch_size=8, monitor=100)
    assert len(lines) == 1
    assert lines[0].startswith("step:  100, loss: ")
    assert MONITOR_LINE.fullmatch(lines[0])


# -- (3) NaN stop -------------------------------------------------------------------------------

def _diverging(kind, mnist_train):
    images, labels = mnist_train[0][:320], mnist_train[1][:320]
    if kind == "nan_input":
        images = images.astype(np.float64) / 255             # the Loader's float contract: [0, 1]
        images[:, 14, 14] = np.nan                           # every batch carries a NaN
        return optim.Adam(lr=1e-3), (images, labels)
    return optim.SGD(lr=1e9), (images, labels)


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("kind", ["huge_lr", "nan_input"])
def test_nan_loss_raises_and_keeps_the_good_checkpoint(kind, mnist_train, tmp_path):
    opt, train = _diverging(kind, mnist_train)
    model = models.lenet5(seed=0)
    lines = []
    trainer = dl.Trainer(model, opt, device="cpu", progress=False, log=lines.append)
    path = tmp_path / "good.npz"
    trainer.save(str(path))                                  # a good checkpoint exists
    good = path.read_bytes()
    bad = {"huge_lr": 2, "nan_input": 1}[kind]               # the step whose loss is not finite
    with pytest.raises(dl.TrainingDiverged, match=rf"at step {bad}\b") as e:
        trainer.fit(train, steps=20, batch_size=32, monitor=5, save_to=str(path))
    assert re.search(r"\b(nan|inf)\b", str(e.value))
    assert str(path) in str(e.value)                         # says which file it left alone
    assert trainer.step == bad - 1                           # the weights are those before it
    assert lines == []                                       # no monitor line for a NaN interval
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.npz"]
    assert np.isfinite(model.flat).all()                     # no update after the bad step reached them
    assert all(np.isfinite(a).all() for a in opt.state.values())   # nor the optimizer's state


def test_nan_is_detected_at_the_last_step_even_off_the_monitor_grid(mnist_train, tmp_path):
    opt, train = _diverging("nan_input", mnist_train)
    trainer = dl.Trainer(models.lenet5(seed=0), opt, device="cpu", progress=False, log=lambda s: None)
    with pytest.raises(dl.TrainingDiverged, match=r"at step 1\b"):   # read at the last step, 3
        trainer.fit(train, steps=3, batch_size=32, monitor=100, save_to=str(tmp_path / "c.npz"))
    assert not (tmp_path / "c.npz").exists()


# -- (4) evaluate covers the whole set ----------------------------------------------------------

def test_evaluate_includes_the_final_short_batch(mnist_train):
    images, labels = mnist_train[0][:1050], mnist_train[1][:1050]
    model = models.lenet5(seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=2e-3), device="cpu", progress=False, log=lambda s: None)
    trainer.fit((images[:320], labels[:320]), steps=10, batch_size=32, monitor=100)

    net = model.lower(dl.graph.passes.drop_final_softmax)    # outputs the logits (its Normalize kept)
    logits = net.forward(as_fed(images), training=False).astype(np.float64)   # all 1,050 in one batch
    hits = np.argmax(logits, axis=1) == labels
    acc_all, acc_first = hits.mean(), hits[:1000].mean()
    assert acc_all != acc_first                              # otherwise the test could not fail

    loss, acc = trainer.evaluate((images, labels), batch_size=1000)
    assert acc == pytest.approx(acc_all, abs=1e-9)
    ref_loss = -log_softmax64(logits)[np.arange(1050), labels].mean()
    assert loss == pytest.approx(ref_loss, rel=1e-4)

    # steps=1 stops after the first batch
    _, acc1 = trainer.evaluate((images, labels), batch_size=1000, steps=1)
    assert acc1 == pytest.approx(acc_first, abs=1e-9)


def test_evaluate_is_in_eval_mode_and_does_not_train():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (100, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, 100).astype(np.uint8)
    model = dl.Sequential([L.Conv2D(4, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.Flatten(),
                           L.Dropout(0.5), L.Dense(10), L.Softmax()], (1, 8, 8), seed=0)
    trainer = dl.Trainer(model, optim.Adam(), device="cpu", progress=False)
    before = model.get_weights()
    r1 = trainer.evaluate((images, labels), batch_size=30)
    r2 = trainer.evaluate((images, labels), batch_size=30)
    assert r1 == r2                                          # no dropout noise, no BN updates
    after = model.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)


# -- (5) epochs ---------------------------------------------------------------------------------

def _indexed_images(N):
    """Images whose first two pixels encode the sample index (index // 256, index % 256)."""
    images = np.zeros((N, 8, 8), dtype=np.uint8)
    images[:, 0, 0], images[:, 0, 1] = np.arange(N) // 256, np.arange(N) % 256
    return images


def _decode(x):
    p = np.rint(np.asarray(x, np.float64)[:, 0, 0, :2] * 255).astype(int)
    return p[:, 0] * 256 + p[:, 1]


def test_epochs_run_len_loader_steps_each_a_permutation(monkeypatch):
    N, B = 1050, 32
    images, labels = _indexed_images(N), (np.arange(N) % 10).astype(np.uint8)
    trainer = dl.Trainer(tiny_net(), optim.SGD(lr=0.01), device="cpu", progress=False, log=lambda s: None)
    seen = []
    step = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", lambda x, y: (seen.append(_decode(x)), step(x, y))[1])

    per_epoch = len(dl.data.Loader(images, labels, B, trainer.device))
    assert per_epoch == N // B == 32                         # drop_last in training

    trainer.fit((images, labels), epochs=1, batch_size=B, monitor=1000)
    assert trainer.step == per_epoch and len(seen) == per_epoch
    assert trainer.optimizer.t == per_epoch
    first = np.concatenate(seen)
    assert len(np.unique(first)) == per_epoch * B            # no sample twice in an epoch
    assert not np.array_equal(first, np.arange(per_epoch * B))   # shuffled

    seen.clear()
    trainer.fit((images, labels), epochs=3, batch_size=B, monitor=1000)          # epochs in all, as Keras's
    assert trainer.step == 3 * per_epoch and len(seen) == 2 * per_epoch
    e2, e3 = np.concatenate(seen[:per_epoch]), np.concatenate(seen[per_epoch:])
    assert len(np.unique(e2)) == len(np.unique(e3)) == per_epoch * B
    assert not np.array_equal(first, e2)                     # reshuffled every epoch


def test_fit_reads_nothing_from_the_device_between_its_monitoring_steps(monkeypatch):
    """A read waits for every step queued on a GPU: each epoch's end (its History record) read the
    optimizer's step count for the lr, and the device then sat idle while the next epoch was drawn."""
    N, B = 320, 32
    images, labels = _indexed_images(N), (np.arange(N) % 10).astype(np.uint8)
    trainer = dl.Trainer(tiny_net(), optim.SGD(lr=0.01), device="cpu", progress=False, log=lambda s: None)
    real, reads = trainer.device.to_host, []
    monkeypatch.setattr(trainer.device, "to_host", lambda a: reads.append(trainer.step) or real(a))
    history = trainer.fit((images, labels), epochs=4, batch_size=B, monitor=15)     # 10 steps an epoch
    assert trainer.step == 40 and len(history.history["lr"]) == 4
    assert set(reads) <= {15, 30, 40}, sorted(set(reads))      # the monitoring intervals' metrics, and the end


# -- (6) a model ending in Softmax trains on its logits -----------------------------------------

def test_softmax_model_uses_the_logits_for_loss_and_gradient():
    rng = np.random.default_rng(0)
    N = 64
    images = rng.integers(0, 256, (N, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, N).astype(np.uint8)
    model = tiny_net(seed=3)
    assert model.outputs[0].kind == "softmax"
    last = model.layer("dense_1")
    last.set_weights({"w": last.get_weights()["w"] * 300})  # logits hundreds apart: float32
    trainer = dl.Trainer(model, optim.SGD(lr=0.0), device="cpu", progress=False)

    probs = model.forward(as_fed(images), training=False)
    assert (probs == 0).any()                                # log(probs) would be -inf here
    z = model.lower(dl.graph.passes.training).forward(as_fed(images)).astype(np.float64)
    assert np.array_equal(np.argmax(z, 1), np.argmax(probs, 1))
    nll = -log_softmax64(z)[np.arange(N), labels]
    assert np.isfinite(nll).all() and nll.max() > 100

    loss, acc = trainer.evaluate((images, labels), batch_size=N)
    assert loss == pytest.approx(nll.mean(), rel=1e-5)
    assert acc == pytest.approx(np.mean(np.argmax(z, 1) == labels))

    # one training step over the whole set (lr 0: weights stay): the same loss, and the gradient
    # of the last bias is mean(softmax(z) - onehot), i.e. backward skipped the Softmax layer
    fit_loss, _ = trainer.fit((images, labels), steps=1, batch_size=N, monitor=1)
    assert fit_loss == pytest.approx(nll.mean(), rel=1e-5)
    p64 = np.exp(log_softmax64(z))
    p64[np.arange(N), labels] -= 1
    np.testing.assert_allclose(model.get_grads()["dense_1/b"], p64.mean(axis=0), rtol=1e-4, atol=1e-7)


def test_trainer_works_on_a_model_without_softmax():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, 64).astype(np.uint8)
    model = tiny_net(seed=3, softmax=False)
    assert model.outputs[0].kind != "softmax"
    trainer = dl.Trainer(model, optim.SGD(lr=0.0), device="cpu", progress=False)
    out = model.forward(as_fed(images), training=False)
    nll = -log_softmax64(out)[np.arange(64), labels]
    loss, _ = trainer.evaluate((images, labels), batch_size=64)
    assert loss == pytest.approx(nll.mean(), rel=1e-5)
    assert math.isfinite(trainer.fit((images, labels), steps=2, batch_size=32, monitor=1)[0])


def test_a_training_step_lets_each_value_go_after_its_last_reader():
    """Liveness (graph/liveness.py): after a step no layer holds what its backward read and the model
    keeps no forward values, so between steps only the parameters stay; the training is the same."""
    import tracemalloc

    def net():
        x = L.Input((3, 16, 16))
        h = x
        for _ in range(3):
            h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(16, (3, 3), padding=1)(h)))
        return dl.Model(x, L.Dense(10)(L.Flatten()(h)), device="cpu")

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 64).astype(np.int32)
    held, weights = {}, {}
    for releases in (False, True):
        trainer = dl.Trainer(net(), optim.SGD(0.01), progress=False, log=lambda s: None)
        step = trainer._step
        assert step.net.releases                       # the step's lowering lets values go by default
        step.net.releases = releases
        trainer.train_step(x, y)
        tracemalloc.start()
        trainer.train_step(x, y)
        held[releases] = tracemalloc.get_traced_memory()[0]        # what the second step left allocated
        tracemalloc.stop()
        weights[releases] = trainer.model.get_weights()
        kept = [layer.name for layer in step.net.layers if getattr(layer, "saved", None) is not None]
        assert (kept == [] and step.net._values is None) if releases else kept
    one_activation = 64 * 16 * 16 * 16 * 4
    assert held[False] - held[True] > 3 * one_activation, held      # the activations no longer stay
    for k, w in weights[False].items():
        np.testing.assert_array_equal(weights[True][k], w, err_msg=k)


def test_fit_timing_leaves_what_comes_before_the_first_step_out():
    """Trainer.timing: `total_s` from the first step on (a slow on_train_begin, the data's loader and its
    fingerprint left out), `first_s` the first step, `steady_ms` a step after it: what benchmarks read
    (benchmarks/dist_worker.py) to time steps without a fit's fixed cost."""
    import time

    class SlowStart(dl.Callback):
        def on_train_begin(self, run):
            time.sleep(1.0)

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (64, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64)
    trainer = dl.Trainer(models.lenet5(), optim.SGD(lr=0.01), device="cpu", seed=0, progress=False,
                         log=lambda s: None)
    t0 = time.perf_counter()
    trainer.fit(x, y, steps=6, batch_size=8, callbacks=[SlowStart()])
    wall = time.perf_counter() - t0
    t = trainer.timing
    assert t["steps"] == 6 and wall >= 1.0 and t["total_s"] < wall - 0.9
    assert t["steady_ms"] == pytest.approx((t["total_s"] - t["first_s"]) / 5 * 1e3)
    assert 0 < t["steady_ms"] < 150                   # a LeNet-5 step at b8 on one core: a few ms, not 1 s / 5
